"""The remediator in the evaluation: in dry-run beside the simulated fleet, deciding on each cycle's verdicts.

After every scoring cycle the cycle's verdict changes go through the
remediator's own decision (services.remediator.decide, the committed policy),
and its executor steps the plans on the simulation's clock, in dry-run: what
it would have cordoned and drained, and when, is recorded in the run's schema
and read back at the end (`timeline`). Two things differ from a deployment, on
purpose: an on-call operator approves what waits for approval after
`approve_after_s` (30 simulated minutes), and the breaker's and the cap's share
of the fleet is all of it, since a simulated fleet of four nodes would trip the
committed 10 % at its first node (the breaker's bound is shown on 1,000 nodes by the
integration tests). evaluation/metrics.py scores it against
the ground truth: healthy GPUs taken out (the goal is none), hard faults acted
on, and the time from the fault to the cordon and to the drain.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from services.remediator.decide import decide
from services.remediator.drivers.node_exec import NodeExec
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap, from_verdict
from services.remediator.policy import Policy, load_policy
from services.remediator.steps import Steps
from shared.contract.models_health import HealthVerdict
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import remediation as store
from shared.store import remediation_ledger as ledger


class ShadowRemediator:
    """The remediator in dry-run on a simulated clock: decides on verdicts, steps its plans."""

    def __init__(
        self, db: DatabaseSettings, policy: Policy | None = None, approve_after_s: float = 1800
    ) -> None:
        committed = policy or load_policy()
        self.policy = committed.model_copy(  # the breaker's and the cap's shares opened to the small fleet
            update={
                "breaker": committed.breaker.model_copy(update={"max_fleet_percent": 100.0}),
                "nodes_out": committed.nodes_out.model_copy(update={"max_fleet_percent": 100.0}),
            }
        )
        self.db, self.approve_after = db, timedelta(seconds=approve_after_s)
        self.now = datetime.fromtimestamp(0, UTC)
        steps = Steps(policy=self.policy, schedulers=[], node_exec=NodeExec({}), nodes=NodeMap(), look_s=1.0)
        self.executor = Executor(db=db, policy=self.policy, steps=steps, dry_run=True, retry_s=1.0,
                                 clock=lambda: self.now)  # fmt: skip

    def after_cycle(self, messages: Iterable[tuple[str, str, Any]], now_ms: int) -> None:
        """Decide on the cycle's verdicts as of `now_ms`, then step every plan as far as it goes."""
        self.now = datetime.fromtimestamp(now_ms / 1000, UTC)
        with connect(self.db) as conn:
            for _kind, _key, message in messages:
                if isinstance(message, HealthVerdict):
                    decide(conn, from_verdict(message, "gpu-health"), policy=self.policy, nodes=NodeMap(),
                           dry_run=True, now=self.now)  # fmt: skip
                    conn.commit()
            waited = self.now - self.approve_after
            store.approve_waiting(conn, dry_run=True, decided_before=waited, at=self.now, by="evaluation")
            conn.commit()
        for _ in range(20):  # dry-run steps go on at once; a plan held stays held
            if not self.executor.run_due():
                break

    def timeline(self) -> list[dict[str, Any]]:
        """Per plan: its GPUs, action, state, and when (ms) it was decided, cordoned and drained."""
        with connect(self.db) as conn:
            rows = ledger.plan_timeline(conn, dry_run=True)
        return [
            {"gpus": list(r["gpu_uuids"]), "node": r["node"], "action": r["action"], "state": r["state"],
             "held_for": r["held_for"], "decided_ms": _ms(r["created_at"]),
             "cordoned_ms": _ms(r["cordoned_at"]), "drained_ms": _ms(r["drained_at"])}
            for r in rows
        ]  # fmt: skip

    def close(self) -> None:
        self.executor.close()


def _ms(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1000)

"""The scorer counts the remediator's plans per GPU: three in a week, and the committed rules file's
pattern sends the GPU for repair, which the remediator then acts on (cordon, drain, kept out)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from services.remediator.findings import from_verdict
from services.scorer.cycle import judge
from services.scorer.rules_config import load_rules
from shared.contract.models_health import HealthVerdict
from shared.plumbing.db import connect
from tests.helpers.remediation import (
    TRUE,
    Remediator,
    add_fleet,
    decide_all,
    gpu_uuid,
    returned,
    rows,
    verdict_finding,
)

PATTERN = "pattern_remediator_acted_too_often"


def history_verdict(r: Remediator, gpu: str, as_of: datetime) -> HealthVerdict | None:
    """The verdict the committed rules give the GPU's history subsystem in a scoring cycle as of `as_of`."""
    with connect(r.db) as conn:
        result = judge(conn, as_of, load_rules(), gpus=[gpu])
    found = [
        v
        for kind, _, v in result.messages
        if kind == "health" and isinstance(v, HealthVerdict) and v.subsystem == "history"
    ]
    return found[-1] if found else None


def test_three_plans_in_a_week_send_the_gpu_for_repair_and_the_remediator_acts_on_it(
    remediator_factory: Callable[..., Remediator],
) -> None:
    r = remediator_factory(dry_run=False, commands={"reset_gpu": TRUE, "compute_check": TRUE})
    add_fleet(r.db, 40)
    gpu, now = gpu_uuid(3, 0), datetime.now(UTC)
    for days_ago in (6, 4, 2):  # each a GPU reset that took: the node validated and back in service
        decide_all(
            r,
            [verdict_finding(3, at=now - timedelta(days=days_ago))],
            dry_run=False,
            at=now - timedelta(days=days_ago),
        )
        r.run_until_settled()
        returned(r, "gpu-node-03")
        if days_ago == 4:
            assert history_verdict(r, gpu, now) is None  # two plans: not yet a pattern
    assert rows(r.db, "SELECT action, state FROM remediations ORDER BY id") == [("reset_gpu", "done")] * 3
    verdict = history_verdict(r, gpu, now)
    assert verdict is not None
    assert (verdict.state, verdict.rule, verdict.action) == ("unhealthy", PATTERN, "send_for_repair")
    assert (verdict.evidence["counts"], verdict.evidence["counted"]) == (["remediated"], 3)
    plans = sorted(at for (at,) in rows(r.db, "SELECT created_at FROM remediations"))
    occurrences: Any = verdict.evidence["occurrences"]
    assert sorted(o["first"] for o in occurrences) == [
        at.isoformat().replace("+00:00", "Z") for at in plans
    ]  # each plan of the remediator's, named by when it started
    finding = from_verdict(verdict, "gpu-health")
    decide_all(r, [finding], dry_run=False)
    r.run_until_settled()
    assert rows(r.db, "SELECT action, state, steps FROM remediations WHERE id = 4") == [
        ("send_for_repair", "done", ["cordon", "drain", "keep_out"])
    ]

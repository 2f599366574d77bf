"""Dry run and live never meet (#40 item 5): over any interleaving of a live remediator and a dry-run one
answering the same topic's verdicts (each in the topic's order, the dry run anywhere before, between or
after the live one's decisions and plan steps), the live remediator decides and does exactly what it does
alone: the same decisions, the same plans in the same states, its own breaker and rate limits."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.remediator.decide import decide
from services.remediator.findings import Finding, NodeMap
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.remediation import T0, TRUE, Remediator, add_fleet, rows, verdict_finding

NODES = 6  # in a fleet of 40 the breaker's bound is 4 nodes: a run can trip it
ACTIONS = ("reset_gpu", "reset_gpu", "reboot_node", "inspect", "send_for_repair", "run_diagnostics")
TABLES = (
    "remediation_events", "remediation_decisions", "remediation_ownership", "remediation_breaker_admissions",
    "gpu_remedies", "remediations",
)  # fmt: skip

verdicts = st.lists(
    st.tuples(st.integers(0, NODES - 1), st.integers(0, 1), st.sampled_from(ACTIONS)), min_size=1, max_size=10
)
# per verdict: when the dry run decides it (before or after the live one, or at the end), and whether each
# remediator's executor steps its plans after it
schedules = st.lists(st.tuples(st.sampled_from(("before", "after", "end")), st.booleans(), st.booleans()))


def forget(db: DatabaseSettings) -> None:
    with connect(db) as conn:
        for table in TABLES:
            conn.execute(f"DELETE FROM {table}")
        conn.execute(
            "UPDATE remediation_control SET breaker = 'closed', tripped_at = NULL, trip_reason = NULL"
        )
        conn.commit()


def decide_one(r: Remediator, finding: Finding, *, dry_run: bool, at: Any) -> None:
    with connect(r.db) as conn:
        decide(conn, finding, policy=r.policy, nodes=NodeMap(), dry_run=dry_run, now=at)
        conn.commit()


def live_record(db: DatabaseSettings) -> tuple[Any, ...]:
    """What the live remediator decided and did, its plans named by their order (ids are shared with the
    dry run's): decisions, plans and their states, breaker admissions and state, remedies, records."""
    plans = [p for (p,) in rows(db, "SELECT id FROM remediations WHERE NOT dry_run ORDER BY id")]
    order = {p: i for i, p in enumerate(plans)}
    decisions = [
        (key, outcome, action, node, order.get(plan))
        for key, outcome, action, node, plan in rows(
            db,
            "SELECT decision_key, outcome, action, node, remediation_id FROM remediation_decisions"
            " WHERE NOT dry_run ORDER BY decision_key",
        )
    ]
    states = rows(
        db,
        "SELECT node, action, state, step, held_for, gpu_uuids, escalated_from IS NOT NULL FROM remediations"
        " WHERE NOT dry_run ORDER BY id",
    )
    breaker = rows(db, "SELECT breaker, trip_reason FROM remediation_control WHERE NOT dry_run")
    admitted = rows(db, "SELECT node FROM remediation_breaker_admissions WHERE NOT dry_run ORDER BY node")
    remedies = rows(db, "SELECT gpu_uuid, remedy FROM gpu_remedies ORDER BY gpu_uuid")
    records = rows(
        db,
        "SELECT kind, status, step, node, count(*) FROM remediation_events WHERE NOT dry_run"
        " GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
    )
    return decisions, states, breaker, admitted, remedies, records


def look(r: Remediator) -> None:
    """One look at each plan in hand: the plans' clock moves past every wait first (the same looks in
    both runs, however long the dry run beside took)."""
    r.clock.advance(1.0)
    r.executor.run_due()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(found=verdicts, schedule=schedules)
def test_the_live_remediators_decisions_are_the_same_with_or_without_a_dry_run_beside_it(
    remediator_factory: Callable[..., Remediator],
    found: list[tuple[int, int, str]],
    schedule: list[tuple[str, bool, bool]],
) -> None:
    commands = {"reset_gpu": TRUE, "reboot": TRUE, "compute_check": TRUE}
    live = remediator_factory(dry_run=False, commands=commands)
    dry = remediator_factory(dry_run=True)
    if not rows(live.db, "SELECT 1 FROM gpu_assets LIMIT 1"):
        add_fleet(live.db, 40)
    findings = [
        (verdict_finding(node, gpu, action=action, at=T0 + timedelta(seconds=i)), T0 + timedelta(seconds=i))
        for i, (node, gpu, action) in enumerate(found)
    ]
    steps = [*schedule, *[("after", True, True)] * len(findings)][: len(findings)]

    def run(beside: bool) -> tuple[Any, ...]:
        forget(live.db)
        for (finding, at), (when, live_steps, dry_steps) in zip(findings, steps, strict=True):
            if beside and when == "before":
                decide_one(dry, finding, dry_run=True, at=at)
            decide_one(live, finding, dry_run=False, at=at)
            if beside and when == "after":
                decide_one(dry, finding, dry_run=True, at=at)
            if beside and dry_steps:
                dry.executor.run_due()
            if live_steps:
                look(live)
        if beside:
            for (finding, at), (when, _, _) in zip(findings, steps, strict=True):
                if when == "end":
                    decide_one(dry, finding, dry_run=True, at=at)
            dry.executor.run_due()
        look(live)
        return live_record(live.db)

    alone = run(beside=False)
    assert run(beside=True) == alone
    # and the dry run, beside it, decided every verdict the live one did
    live_keys = rows(live.db, "SELECT decision_key FROM remediation_decisions WHERE NOT dry_run ORDER BY 1")
    assert (
        rows(live.db, "SELECT decision_key FROM remediation_decisions WHERE dry_run ORDER BY 1") == live_keys
    )

"""Plans stepped on the real database: dry-run records every step, validation keeps a node out until it
has earned its return, a failed validation escalates, the breaker stops a mass failure, a pause holds
everything."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from services.remediator.policy import Policy, Validation
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.remediation import (
    FALSE,
    TRUE,
    Remediator,
    add_fleet,
    add_nodes,
    decide_all,
    gpu_uuid,
    rows,
    sample_again,
    score,
    verdict_finding,
)


def in_validation(r: Remediator, node: int = 0) -> Remediator:
    """`r` with a reset_gpu plan for the node's first GPU, stepped up to its validation."""
    add_fleet(r.db, node + 1)
    decide_all(r, [verdict_finding(node)], dry_run=False)
    r.run_until_settled()
    return r


def plan_events(db: DatabaseSettings, plan_id: int = 1) -> list[tuple[Any, ...]]:
    return rows(
        db,
        "SELECT kind, step, status FROM remediation_events WHERE remediation_id = %s ORDER BY time, kind",
        (plan_id,),
    )


def test_a_dry_run_records_every_step_it_would_take(remediator_factory: Callable[..., Remediator]) -> None:
    r = remediator_factory(dry_run=True)
    add_fleet(r.db, 1)
    decide_all(r, [verdict_finding(0)], dry_run=True)
    r.run_until_settled()
    # its validation lasts as the live one's would: the plan stays in hand (later findings join it)
    assert rows(r.db, "SELECT steps[step + 1], state FROM remediations") == [("validate", "running")]
    now = r.clock()
    for cycle in range(1, 4):  # the first look's cycle (T0) is the one before the remedy
        score(r.db, "gpu-node-00", now + timedelta(seconds=cycle), state="unhealthy")
        r.run_until_settled(pause_s=0.06)
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]  # the policy returns the node
    assert [e for e in plan_events(r.db) if e[2] != "in_progress"] == [
        ("decision", None, "act"),
        ("action", "cordon", "dry_run"),
        ("action", "drain", "dry_run"),
        ("action", "reset_gpu", "dry_run"),
        ("action", "reset_gpu", "remedied"),
        ("validation", "validate", "passed"),
        ("action", "return", "dry_run"),
        ("outcome", None, "done"),
    ]
    assert rows(r.db, "SELECT count(*) FROM gpu_remedies") == [(0,)]  # a dry run's remedy stays with its plan


def test_a_node_returns_only_after_its_gpus_come_back_the_check_passes_and_cycles_are_healthy(
    remediator_factory: Callable[..., Remediator],
) -> None:
    r = in_validation(remediator_factory(dry_run=False, commands={"reset_gpu": TRUE, "compute_check": TRUE}))
    assert rows(r.db, "SELECT steps[step + 1], state FROM remediations") == [("validate", "running")]
    now = datetime.now(UTC)
    score(r.db, "gpu-node-00", now)  # a cycle before the GPUs are back counts for nothing
    r.run_until_settled()
    sample_again(r.db, "gpu-node-00", now)
    for cycle in range(1, 3):
        score(r.db, "gpu-node-00", now + timedelta(seconds=cycle))
        r.run_until_settled(pause_s=0.06)
    assert rows(r.db, "SELECT state FROM remediations") == [("running",)]  # 2 of 3 healthy cycles
    score(r.db, "gpu-node-00", now + timedelta(seconds=3), state="degraded")  # the count starts again
    r.run_until_settled(pause_s=0.06)
    for cycle in range(4, 7):  # each run_until_settled looks again, after the step's look_s, before it ends
        score(r.db, "gpu-node-00", now + timedelta(seconds=cycle))
        r.run_until_settled(pause_s=0.06)
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]
    events = [e for e in plan_events(r.db) if e[2] != "in_progress"]
    assert events == [
        ("decision", None, "act"),
        ("action", "reset_gpu", "ok"),
        ("action", "reset_gpu", "remedied"),  # gpu_remedies: the scorer counts nothing it resolved before it
        ("action", "validate", "ok"),  # the compute check, run as part of the validation
        ("validation", "validate", "passed"),
        ("outcome", None, "done"),
    ]


def test_a_waiting_validation_records_what_it_has_to_say_once_not_at_every_look(
    remediator_factory: Callable[..., Remediator],
) -> None:
    """In `make up`, live, one validation of three minutes wrote 90 identical "0 of 3 healthy cycles"
    records, one per look, to remediation_events and gpu-remediations."""
    r = in_validation(remediator_factory(dry_run=False, commands={"reset_gpu": TRUE, "compute_check": TRUE}))
    for _ in range(4):  # each looks again, with nothing new to see
        r.run_until_settled(pause_s=0.06)
    said = [str(reason) for (reason,) in rows(
        r.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'in_progress'"
              " ORDER BY time",
    )]  # fmt: skip
    assert said
    assert len(said) == len(set(said)), said
    assert rows(r.db, "SELECT state FROM remediations") == [("running",)]


def test_a_failed_compute_check_keeps_the_node_out_and_escalates(
    remediator_factory: Callable[..., Remediator],
) -> None:
    r = in_validation(remediator_factory(dry_run=False, commands={"reset_gpu": TRUE, "compute_check": FALSE}))
    sample_again(r.db, "gpu-node-00", datetime.now(UTC))
    r.run_until_settled()
    assert rows(r.db, "SELECT id, action, state, held_for, escalated_from FROM remediations ORDER BY id") == [
        (1, "reset_gpu", "escalated", None, None),
        (2, "reboot_node", "held", "approval", 1),  # the policy wants an operator for a reboot
    ]
    (reason,) = rows(
        r.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'failed'"
    )[0]
    assert "max rel err" in reason
    assert ("outcome", None, "escalated") in plan_events(r.db)
    assert not [e for e in plan_events(r.db) if e[1] == "return"]  # never returned


def test_a_gpu_that_comes_back_as_another_fails_the_validation(
    remediator_factory: Callable[..., Remediator],
) -> None:
    r = in_validation(remediator_factory(dry_run=False, commands={"reset_gpu": TRUE, "compute_check": TRUE}))
    sample_again(r.db, "gpu-node-00", datetime.now(UTC), uuids=["GPU-99999999-0000-4000-8000-000000000000"])
    r.run_until_settled()
    (reason,) = rows(
        r.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'failed'"
    )[0]
    assert "not on the node before" in reason


def test_a_validation_that_never_earns_its_cycles_times_out(
    remediator_factory: Callable[..., Remediator], policy: Policy
) -> None:
    rules = Validation(healthy_cycles=2, compute_check=False, timeout_s=1)
    r = remediator_factory(dry_run=False, commands={"reset_gpu": TRUE}, policy_changes={"validation": rules})
    in_validation(r)
    sample_again(r.db, "gpu-node-00", datetime.now(UTC))
    score(r.db, "gpu-node-00", datetime.now(UTC), state="unhealthy")
    r.run_until_settled()
    assert rows(r.db, "SELECT state FROM remediations WHERE id = 1") == [("running",)]
    r.clock.advance(1.1)  # past the validation's timeout_s
    r.run_until_settled()
    assert rows(r.db, "SELECT state FROM remediations WHERE id = 1") == [("escalated",)]
    (reason,) = rows(
        r.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'failed'"
    )[0]
    assert reason.startswith("validation timed out: 0 of 2 healthy cycles")


def test_a_mass_failure_trips_the_breaker_at_its_bound(
    remediator_factory: Callable[..., Remediator], policy: Policy
) -> None:
    unlimited = policy.for_action("reset_gpu").model_copy(update={"max_per_window": None})
    r = remediator_factory(
        dry_run=True, policy_changes={"actions": {**policy.actions, "reset_gpu": unlimited}}
    )
    add_fleet(r.db, 1000, gpus=1)
    decide_all(r, [verdict_finding(n) for n in range(1000)], dry_run=True)
    r.executor.batch = 1000
    r.run_until_settled()
    bound = r.policy.breaker.bound(1000)
    assert bound == 10
    assert rows(
        r.db,
        "SELECT count(DISTINCT node) FROM remediation_events WHERE step = 'cordon' AND status = 'dry_run'",
    ) == [(bound,)]
    assert rows(r.db, "SELECT count(*) FROM remediation_breaker_admissions") == [(bound,)]
    assert rows(r.db, "SELECT kind, status FROM remediation_events WHERE kind = 'breaker'") == [
        ("breaker", "tripped")
    ]
    assert rows(r.db, "SELECT breaker FROM remediation_control WHERE dry_run") == [("open",)]
    assert rows(r.db, "SELECT count(*) FROM remediations WHERE held_for = 'breaker'") == [(1000 - bound,)]
    # a restart finds it open, even once its window has passed (no node taken out within it any more):
    # nothing more is taken out until an operator resets it
    short = r.policy.breaker.model_copy(update={"window_s": 1})
    r2 = remediator_factory(dry_run=True, policy_changes={"actions": r.policy.actions, "breaker": short})
    r2.clock.advance(1.1)  # past the short window
    add_nodes(r.db, {"gpu-node-new": [gpu_uuid(5000, 0)]})
    decide_all(r2, [verdict_finding(5000, hostname="gpu-node-new")], dry_run=True)
    r2.run_until_settled()
    assert rows(r.db, "SELECT state, held_for FROM remediations WHERE node = 'gpu-node-new'") == [
        ("held", "breaker")
    ]
    assert rows(r.db, "SELECT count(*) FROM remediation_breaker_admissions") == [(bound,)]


def test_a_pause_holds_every_plan_until_resumed(remediator_factory: Callable[..., Remediator]) -> None:
    r = remediator_factory(dry_run=True)
    add_fleet(r.db, 1)
    with connect(r.db) as conn:
        conn.execute("SELECT remediation_pause('ops')")
        conn.commit()
    decide_all(r, [verdict_finding(0)], dry_run=True)
    assert r.executor.run_due() == []
    assert rows(r.db, "SELECT state, step FROM remediations") == [("running", 0)]
    with connect(r.db) as conn:
        conn.execute("SELECT remediation_resume('ops')")
        conn.commit()
    r.run_until_settled()  # as far as a dry run goes without scoring cycles: its validation waits for them
    assert rows(r.db, "SELECT steps[step + 1], state FROM remediations") == [("validate", "running")]
    assert [
        s
        for k, s in rows(r.db, "SELECT kind, status FROM remediation_events ORDER BY time")
        if k == "control"
    ] == ["paused", "resumed"]
    assert gpu_uuid(0, 0)


def test_a_repair_mark_withdraws_the_held_plan_it_made_moot_once_per_mode_and_nothing_else(
    remediator_factory: Callable[..., Remediator],
) -> None:
    live, dry = remediator_factory(dry_run=False), remediator_factory(dry_run=True)
    add_fleet(live.db, 40)
    before = datetime.now(UTC) - timedelta(minutes=1)
    findings = [verdict_finding(n, action="reboot_node") for n in (0, 1)]  # each held for approval
    decide_all(live, findings, dry_run=False, at=before)
    decide_all(dry, findings[1:], dry_run=True, at=before)
    with connect(live.db) as conn:  # as the API marks it
        conn.execute(
            "SELECT * FROM mark_gpu_repaired(%s, 'repaired', 'oncall', 'new board')", (gpu_uuid(0, 0),)
        )
        conn.commit()
    for _ in range(2):  # answered once, however often it is looked at
        live.executor.run_due()
        dry.executor.run_due()
    assert rows(live.db, "SELECT node, state, dry_run FROM remediations ORDER BY id") == [
        ("gpu-node-00", "withdrawn", False),  # the repaired GPU's: moot
        ("gpu-node-01", "held", False),  # another node's: stays held
        ("gpu-node-01", "held", True),
    ]
    # the node was never taken out: nothing to validate; the dry run had no plan on it: nothing to answer
    assert rows(
        live.db, "SELECT outcome, dry_run FROM remediation_decisions WHERE decision_key LIKE 'gpu_repairs/%'"
    ) == [("ignored", False)]
    ((reason,),) = rows(live.db, "SELECT reason FROM remediation_events WHERE status = 'withdrawn'")
    assert reason.startswith(f"GPU {gpu_uuid(0, 0)} repaired by oncall at ")
    assert reason.endswith("the repair made this reboot_node moot")

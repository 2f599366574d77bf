"""Decisions on the real database: one per verdict however often it comes, a plan per node, and the holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.remediator.decide import Decided, decide
from services.remediator.findings import Finding, NodeMap
from services.remediator.policy import Policy
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.remediation import T0, add_fleet, gpu_uuid, rows, verdict_finding


def decide_now(
    db: DatabaseSettings,
    policy: Policy,
    finding: Finding,
    *,
    dry_run: bool = True,
    nodes: NodeMap | None = None,
) -> Decided:
    with connect(db) as conn:
        decided = decide(
            conn, finding, policy=policy, nodes=nodes or NodeMap(), dry_run=dry_run, now=datetime.now(UTC)
        )
        conn.commit()
    return decided


def test_a_verdict_is_decided_once_however_often_it_comes(migrated: DatabaseSettings, policy: Policy) -> None:
    add_fleet(migrated, 2)
    finding = verdict_finding(0)
    first = decide_now(migrated, policy, finding)
    assert (first.outcome, first.plan_id) == ("act", first.plan_id)
    for _ in range(3):  # a redelivery, a restart, a second consumer after a rebalance
        assert decide_now(migrated, policy, finding).outcome == ""
    assert rows(migrated, "SELECT count(*) FROM remediation_decisions") == [(1,)]
    assert rows(migrated, "SELECT node, action, state, gpu_uuids, dry_run FROM remediations") == [
        ("gpu-node-00", "reset_gpu", "running", [gpu_uuid(0, 0)], True)
    ]
    assert rows(migrated, "SELECT kind, status FROM remediation_events") == [("decision", "act")]


def test_a_second_gpu_of_the_node_joins_its_plan(migrated: DatabaseSettings, policy: Policy) -> None:
    add_fleet(migrated, 1, gpus=4)
    plan = decide_now(migrated, policy, verdict_finding(0, 0)).plan_id
    joined = decide_now(migrated, policy, verdict_finding(0, 3, rule="xid_119"))
    assert (joined.outcome, joined.plan_id) == ("joined", plan)
    assert rows(migrated, "SELECT gpu_uuids FROM remediations") == [([gpu_uuid(0, 0), gpu_uuid(0, 3)],)]


def test_a_finding_that_needs_more_than_a_reset_not_yet_done_escalates_the_plan_at_once(
    migrated: DatabaseSettings, policy: Policy
) -> None:
    add_fleet(migrated, 1, gpus=4)
    plan = decide_now(migrated, policy, verdict_finding(0, 0)).plan_id
    escalated = decide_now(migrated, policy, verdict_finding(0, 3, action="reboot_node"))
    assert escalated.outcome == "held"  # the policy wants an operator's approval for a reboot
    assert rows(
        migrated, "SELECT id, action, state, escalated_from, gpu_uuids FROM remediations ORDER BY id"
    ) == [
        (plan, "reset_gpu", "escalated", None, [gpu_uuid(0, 0)]),
        (escalated.plan_id, "reboot_node", "held", plan, [gpu_uuid(0, 0), gpu_uuid(0, 3)]),
    ]
    assert rows(migrated, "SELECT status FROM remediation_events WHERE kind = 'outcome'") == [("escalated",)]
    # once the reset is carried out, a reboot-class finding joins: the validation judges it
    with connect(migrated) as conn:
        conn.execute("UPDATE remediations SET state = 'escalated' WHERE id = %s", (escalated.plan_id,))
        conn.commit()
    later = decide_now(migrated, policy, verdict_finding(0, 1, at=T0.replace(minute=1))).plan_id
    with connect(migrated) as conn:
        conn.execute("UPDATE remediations SET step = 3 WHERE id = %s", (later,))
        conn.commit()
    joined = decide_now(
        migrated, policy, verdict_finding(0, 2, action="reboot_node", at=T0.replace(minute=2))
    )
    assert (joined.outcome, joined.plan_id) == ("joined", later)


def test_what_calls_for_nothing_or_maps_nowhere(migrated: DatabaseSettings, policy: Policy) -> None:
    add_fleet(migrated, 1)
    assert decide_now(migrated, policy, verdict_finding(0, action="none")).outcome == ""
    assert decide_now(migrated, policy, verdict_finding(0, action="restart_workload")).outcome == "ignored"
    # a GPU the inventory does not know, whose message carries no hostname (or one no scheduler can name)
    assert decide_now(migrated, policy, verdict_finding(7, hostname="")).outcome == "unmapped"
    assert decide_now(migrated, policy, verdict_finding(8, hostname="bad host;rm -rf")).outcome == "unmapped"
    # the inventory places a GPU whose message had no hostname
    mapped = decide_now(migrated, policy, verdict_finding(0, 1, hostname="", at=T0.replace(minute=5)))
    assert mapped.outcome == "act"
    assert rows(migrated, "SELECT node FROM remediations") == [("gpu-node-00",)]
    # the node map moves a GPU elsewhere
    moved = NodeMap(gpus={gpu_uuid(7, 0): "gpu-node-09"})
    assert (
        decide_now(migrated, policy, verdict_finding(7, at=T0.replace(minute=9)), nodes=moved).outcome
        == "act"
    )
    assert ("gpu-node-09",) in rows(migrated, "SELECT node FROM remediations")


def test_approval_and_the_limits_hold_a_plan_for_an_operator(
    migrated: DatabaseSettings, policy: Policy
) -> None:
    add_fleet(migrated, 30)
    held = decide_now(migrated, policy, verdict_finding(0, action="reboot_node"))
    assert held.outcome == "held"
    assert rows(migrated, "SELECT state, held_for FROM remediations") == [("held", "approval")]
    # rate limit: a node's third plan within a day waits (the first two are over)
    for minute in (1, 2, 3):
        with connect(migrated) as conn:
            conn.execute("UPDATE remediations SET state = 'done' WHERE node = 'gpu-node-01'")
            conn.commit()
        decided = decide_now(migrated, policy, verdict_finding(1, at=T0.replace(minute=minute)))
    assert decided.outcome == "held"
    assert "plans on gpu-node-01" in (decided.reason or "")
    # class limit: the 21st reset within the hour waits, fleet-wide
    outcomes = [decide_now(migrated, policy, verdict_finding(n)).outcome for n in range(2, 30)]
    started = 2 + 1  # reset plans so far: gpu-node-01's two that ran (its third was held)
    assert outcomes.count("act") == 20 - (started - 1)
    assert rows(migrated, "SELECT count(*) FROM remediations WHERE held_for = 'class_limit'")[0][0] >= 1


def test_dry_run_and_live_keep_apart(migrated: DatabaseSettings, policy: Policy) -> None:
    add_fleet(migrated, 1)
    assert decide_now(migrated, policy, verdict_finding(0), dry_run=True).outcome == "act"
    live = verdict_finding(0, at=T0.replace(minute=1))
    assert decide_now(migrated, policy, live, dry_run=False).outcome == "act"  # its own plan, not a join
    assert sorted(rows(migrated, "SELECT dry_run FROM remediations")) == [(False,), (True,)]


def _left(db: DatabaseSettings, sql: str, params: Any = None) -> None:
    with connect(db) as conn:
        conn.execute(sql, params)
        conn.commit()


@pytest.mark.parametrize(
    ("state", "last_step", "successor", "mark", "held"),
    [
        (state, last_step, successor, mark, held)
        for state in ("done", "failed", "escalated")
        for last_step in ("return", "keep_out")
        for successor in (False, True)
        for mark in (None, "before", "after")
        if successor is False or state == "escalated"
        for held in [
            mark != "after"
            and (
                state == "failed"
                or (state == "done" and last_step == "keep_out")
                or (state == "escalated" and not successor)
            )
        ]
    ],
)
def test_a_node_left_out_for_a_person_is_not_put_back_by_a_later_plan_of_its_own(
    migrated: DatabaseSettings,
    policy: Policy,
    state: str,
    last_step: str,
    successor: bool,
    mark: str | None,
    held: bool,
) -> None:
    """After a plan left a node out for a person, a new finding on it waits for an operator's approval
    (an automatic plan that passed its validation would return the node), until a GPU of it is marked
    repaired or returned after that plan; a node its last plan returned is automatic again."""
    add_fleet(migrated, 1, gpus=2)
    first = decide_now(migrated, policy, verdict_finding(0, 0)).plan_id
    ended = T0 + timedelta(minutes=10)
    _left(
        migrated,
        "UPDATE remediations SET state = %s, steps = array_append(steps, %s), updated_at = %s,"
        " created_at = %s WHERE id = %s",
        (state, last_step, ended, T0 - timedelta(days=2), first),
    )
    if successor:  # an escalation's next plan, itself over and returned
        _left(
            migrated,
            "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, dry_run,"
            " decision_key, escalated_from, created_at, updated_at, next_at)"
            " SELECT node, gpu_uuids, 'reboot_node', finding, ARRAY['cordon', 'return'], 'done', dry_run,"
            " 'next', id, %s, %s, %s FROM remediations WHERE id = %s",
            (T0 - timedelta(days=2), ended + timedelta(minutes=1), ended, first),
        )
    if mark is not None:
        at = ended + (timedelta(minutes=5) if mark == "after" else -timedelta(minutes=5))
        _left(
            migrated,
            "INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by) VALUES (%s, %s, 'repaired', 'test')",
            (gpu_uuid(0, 0), at),  # the GPU the plan was about
        )
    later = decide_now(migrated, policy, verdict_finding(0, 1, at=T0 + timedelta(hours=1)))
    assert later.outcome == ("held" if held else "act"), later.reason
    if held:
        assert f"plan {first}" in (later.reason or "")
        assert "out for a person" in (later.reason or "")
        newest = rows(migrated, "SELECT state, held_for FROM remediations ORDER BY id DESC LIMIT 1")
        assert newest == [("held", "approval")]


def test_a_reset_that_joins_a_reboot_held_for_approval_starts_it(
    migrated: DatabaseSettings, policy: Policy
) -> None:
    """A reboot waits for an operator for the work it stops; a reset-class finding on another GPU of the node
    would stop that work by itself, so joining the held reboot starts it: one round ends both faults."""
    add_fleet(migrated, 1, gpus=2)
    held = decide_now(migrated, policy, verdict_finding(0, 0, action="reboot_node"), dry_run=False)
    assert held.outcome == "held"
    joined = decide_now(migrated, policy, verdict_finding(0, 1, at=T0.replace(minute=1)), dry_run=False)
    assert (joined.outcome, joined.plan_id) == ("joined", held.plan_id)
    assert f"plan {held.plan_id} (reboot_node) starts without one" in (joined.reason or "")
    assert rows(migrated, "SELECT action, state, held_for, approved_by, gpu_uuids FROM remediations") == [
        ("reboot_node", "running", None, None, [gpu_uuid(0, 0), gpu_uuid(0, 1)])
    ]
    assert rows(migrated, "SELECT status, reason FROM remediation_events WHERE kind = 'decision'")[-1] == (
        "joined",
        joined.reason,
    )


@pytest.mark.parametrize(
    "keeps_it", ["policy", "reset_approval", "rate_limit", "breaker", "dry_run", "same_gpu"]
)
def test_what_keeps_a_held_reboot_held_when_a_finding_joins_it(
    migrated: DatabaseSettings, policy: Policy, keeps_it: str
) -> None:
    """Only a finding on another GPU, that the policy acts on by itself and that its own plan would not be
    held for (approval, the breaker, the node's rate limit), starts a held reboot, and only in its mode."""
    add_fleet(migrated, 1, gpus=2)
    change: dict[str, tuple[str, dict[str, Any]]] = {
        "policy": ("reboot_node", {"starts_when_joined": False}),
        "reset_approval": ("reset_gpu", {"mode": "approval"}),
    }
    if keeps_it in change:  # an operator who wants to say when, whatever joins; or to approve resets too
        action, update = change[keeps_it]
        rules = policy.actions[action].model_copy(update=update)
        policy = policy.model_copy(update={"actions": {**policy.actions, action: rules}})
    if keeps_it == "rate_limit":  # the node had its two plans today
        for minute in (1, 2):
            decide_now(migrated, policy, verdict_finding(0, 0, at=T0.replace(minute=minute)), dry_run=False)
            _left(migrated, "UPDATE remediations SET state = 'done'")
    if keeps_it == "breaker":
        _left(migrated, "UPDATE remediation_control SET breaker = 'open' WHERE NOT dry_run")
    held = decide_now(migrated, policy, verdict_finding(0, 0, action="reboot_node"), dry_run=False)
    joining = verdict_finding(0, 0 if keeps_it == "same_gpu" else 1, at=T0.replace(minute=5))
    decided = decide_now(migrated, policy, joining, dry_run=keeps_it == "dry_run")
    assert decided.outcome == ("act" if keeps_it == "dry_run" else "joined"), decided.reason
    assert "starts without one" not in (decided.reason or "")
    assert rows(migrated, "SELECT state, held_for FROM remediations WHERE id = %s", (held.plan_id,)) == [
        ("held", "approval")
    ]

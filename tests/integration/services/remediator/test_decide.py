"""Decisions on the real database: one per verdict however often it comes, a plan per node, and the holds."""

from __future__ import annotations

from datetime import UTC, datetime

from services.remediator.decide import Decided, decide
from services.remediator.findings import Finding, NodeMap
from services.remediator.policy import Policy
from shared.config import DatabaseSettings
from shared.db import connect
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
    joined = decide_now(migrated, policy, verdict_finding(0, 3, action="reboot_node"))
    assert (joined.outcome, joined.plan_id) == ("joined", plan)
    assert rows(migrated, "SELECT gpu_uuids FROM remediations") == [([gpu_uuid(0, 0), gpu_uuid(0, 3)],)]


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

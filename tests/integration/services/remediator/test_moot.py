"""A held plan whose findings resolved by themselves before it acted is withdrawn, on the real database.

Seen in `make up`, live: every node held a reboot for approval after GPUs went silent and came back,
and the node's next real fault (an XID 119) joined that held plan and was never acted on.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from services.remediator.decide import decide
from services.remediator.findings import NodeMap
from services.remediator.moot import withdraw_if_moot
from services.remediator.policy import Policy
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.remediation import T0, add_fleet, node_name, rows, score, verdict_finding


@pytest.mark.parametrize(
    ("case", "withdrawn"),
    [
        ("all healthy", True),
        ("another GPU of the plan still unhealthy", False),
        ("the plan escalated from another", False),
        ("the node is held out by this mode", False),
        ("the plan is running", False),
        ("the other mode's healthy verdict", False),
    ],
)
def test_a_held_plan_that_never_acted_goes_when_its_gpus_are_healthy_and_only_then(
    migrated: DatabaseSettings, policy: Policy, case: str, withdrawn: bool
) -> None:
    add_fleet(migrated, 1)
    node = node_name(0)
    now = datetime.now(UTC)
    with connect(migrated) as conn:
        for index in (0, 1):  # a reboot held for approval, the node's second GPU joined
            finding = verdict_finding(0, index, action="reboot_node")
            decide(conn, finding, policy=policy, nodes=NodeMap(), dry_run=False, now=now)
        conn.commit()
    assert rows(migrated, "SELECT state, held_for, cardinality(gpu_uuids) FROM remediations") == [
        ("held", "approval", 2)
    ]
    score(migrated, node, now)  # both GPUs healthy again
    with connect(migrated) as conn:
        if case == "another GPU of the plan still unhealthy":
            conn.execute(
                "UPDATE gpu_status SET state = 'unhealthy' WHERE gpu_uuid = %s",
                (verdict_finding(0, 1).gpu_uuid,),
            )
        elif case == "the plan escalated from another":
            conn.execute("UPDATE remediations SET escalated_from = id")
        elif case == "the node is held out by this mode":
            conn.execute(
                "INSERT INTO remediation_ownership (node, scheduler, dry_run, remediation_id, since)"
                " SELECT node, 'kubernetes', false, id, now() FROM remediations"
            )
        elif case == "the plan is running":
            conn.execute("UPDATE remediations SET state = 'running', held_for = NULL")
        healthy = replace(verdict_finding(0), action="none")
        records = withdraw_if_moot(conn, healthy, dry_run=case == "the other mode's healthy verdict", now=now)
        conn.commit()
    states = rows(migrated, "SELECT state FROM remediations")
    assert (states == [("withdrawn",)]) is withdrawn
    assert len(records) == (1 if withdrawn else 0)
    recorded = rows(
        migrated, "SELECT kind, status, reason FROM remediation_events WHERE status = 'withdrawn'"
    )
    assert len(recorded) == (1 if withdrawn else 0)
    if withdrawn:
        assert "moot before it acted" in recorded[0][2]
        # the node's next finding opens a plan of its own instead of joining a plan that waits for a person
        with connect(migrated) as conn:
            later = verdict_finding(0, 1, rule="xid_119", at=T0.replace(minute=5))
            decided = decide(
                conn, later, policy=policy, nodes=NodeMap(), dry_run=False, now=datetime.now(UTC)
            )
            conn.commit()
        assert decided.outcome == "act"

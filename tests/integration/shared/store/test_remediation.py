"""The remediator's reads on the real database: which node a plan left out for a person."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.store import remediation

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
NODES = ("node-a", "node-b")
GPUS = ("GPU-a0", "GPU-a1", "GPU-b0")


@dataclass(frozen=True)
class Plan:
    node: str
    gpus: tuple[str, ...]
    state: str
    steps: tuple[str, ...]
    dry_run: bool
    minute: int  # updated_at: T0 + minute (ties happen: the newer id wins)
    escalated_from: int | None  # an earlier plan's index


@dataclass(frozen=True)
class Mark:
    gpu: str
    minute: int  # at T0 + minute: before, at or after a plan's end


plans = st.lists(
    st.builds(
        Plan,
        node=st.sampled_from(NODES),
        gpus=st.lists(st.sampled_from(GPUS), min_size=1, max_size=2, unique=True).map(tuple),
        state=st.sampled_from(["held", "running", "done", "failed", "escalated"]),
        steps=st.lists(st.sampled_from(["cordon", "drain", "return", "keep_out"]), max_size=3).map(tuple),
        dry_run=st.booleans(),
        minute=st.integers(0, 4),
        escalated_from=st.none() | st.integers(0, 4),
    ),
    max_size=5,
)
marks = st.lists(st.builds(Mark, gpu=st.sampled_from(GPUS), minute=st.integers(0, 5)), max_size=3)


def store(conn: psycopg.Connection[Any], history: list[Plan], repairs: list[Mark]) -> list[Plan]:
    """The plans (ids 1.. in order; a second plan in hand on a node is stored as done, as the index wants)
    and the marks, in place of what the last example left."""
    conn.execute("TRUNCATE remediations, gpu_repairs RESTART IDENTITY CASCADE")
    stored: list[Plan] = []
    for plan in history:
        in_hand = {(p.node, p.dry_run) for p in stored if p.state in ("held", "running")}
        if plan.state in ("held", "running") and (plan.node, plan.dry_run) in in_hand:
            plan = Plan(**{**plan.__dict__, "state": "done"})
        if plan.escalated_from is not None and plan.escalated_from >= len(stored):
            plan = Plan(**{**plan.__dict__, "escalated_from": None})
        stored.append(plan)
        at = T0 + timedelta(minutes=plan.minute)
        conn.execute(
            "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, dry_run, decision_key,"
            " escalated_from, created_at, updated_at, next_at) VALUES"
            " (%s, %s, 'reset_gpu', 'xid_79', %s, %s, %s, %s, %s, %s, %s, %s)",
            (plan.node, list(plan.gpus), list(plan.steps), plan.state, plan.dry_run, f"k{len(stored)}",
             None if plan.escalated_from is None else plan.escalated_from + 1, T0, at, at),
        )  # fmt: skip
    for mark in repairs:
        conn.execute(
            "INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by) VALUES (%s, %s, 'repaired', 'test')",
            (mark.gpu, T0 + timedelta(minutes=mark.minute)),
        )
    return stored


def left_out(history: list[Plan], repairs: list[Mark], node: str, dry_run: bool) -> int | None:
    """What the docstring says, read the long way: the id of the node's newest finished plan when it left
    the node out and no GPU of it was marked after it ended."""
    finished = [
        (p.minute, i + 1, p)
        for i, p in enumerate(history)
        if p.node == node and p.dry_run == dry_run and p.state in ("done", "failed", "escalated")
    ]
    if not finished:
        return None
    minute, plan_id, plan = max(finished, key=lambda f: (f[0], f[1]))
    successor = any(p.escalated_from == plan_id - 1 for p in history)
    out = (
        plan.state == "failed"
        or (plan.state == "done" and plan.steps[-1:] == ("keep_out",))
        or (plan.state == "escalated" and not successor)
    )
    marked = any(m.gpu in plan.gpus and m.minute > minute for m in repairs)
    return plan_id if out and not marked else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=plans, repairs=marks)
def test_a_node_is_left_out_for_a_person_exactly_when_its_newest_finished_plan_says_so(
    conn: psycopg.Connection[Any], history: list[Plan], repairs: list[Mark]
) -> None:
    """Plans in every state, on two nodes, live and dry-run, escalations with and without a next plan, marks
    on the plan's GPUs and others before, at and after its end: one statement answers as the rule reads."""
    stored = store(conn, history, repairs)
    for node in NODES:
        for dry_run in (False, True):
            found = remediation.left_out_for_a_person(conn, node, dry_run)
            assert (found and found["id"]) == left_out(stored, repairs, node, dry_run), (node, dry_run)
            if found is not None:
                assert (found["node"], found["dry_run"]) == (node, dry_run)
    conn.rollback()


def test_an_escalation_whose_next_plan_waits_for_approval_is_not_left_out(
    conn: psycopg.Connection[Any],
) -> None:
    """The escalated plan is the newest finished one; its next plan is held, not finished: a person already
    has it in hand, through that plan's approval."""
    escalated = Plan("node-a", ("GPU-a0",), "escalated", ("cordon", "reset_gpu"), False, 3, None)
    held = Plan("node-a", ("GPU-a0",), "held", ("cordon", "reboot_node"), False, 4, 0)
    store(conn, [escalated, held], [])
    assert remediation.left_out_for_a_person(conn, "node-a", False) is None
    store(conn, [escalated], [Mark("GPU-a0", 3)])  # marked as it ended, not after: still out
    left = remediation.left_out_for_a_person(conn, "node-a", False)
    assert left is not None
    assert (left["id"], left["state"], left["gpu_uuids"]) == (1, "escalated", ["GPU-a0"])

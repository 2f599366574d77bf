"""A repair ends what it made moot: a repair or return mark on a GPU of a node the remediator holds out.

Each mark (gpu_repairs, through `gpuhealth repaired` or the API) on a GPU of a
node this mode has had plans on is answered once per mode, with a decision
keyed `gpu_repairs/<id>`:

- a plan held for an operator (an escalation waiting for approval, a plan the
  breaker or a limit holds) that takes in the repaired GPU and predates the mark
  is withdrawn, with the mark named on its record;
- a node the remediator holds out (its plan failed, escalated to nobody, kept it
  out, or its escalation was just withdrawn) gets a validation plan: the GPUs
  seen again, the compute check and healthy cycles after the mark, then the node
  returns. If it fails, the node stays out for a person (no rung above a repair);
- a plan running on the node goes on: its validation judges the repaired GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.store import remediation as store
from shared.store import remediation_ledger as ledger
from shared.store.remediation import SyncConn
from shared.store.results import Row

from . import validation
from .record import event

# Marks older than this are not answered (a remediator started long after them finds the node as it is).
LOOKBACK = timedelta(days=7)


def key_of(mark: Row) -> str:
    return f"gpu_repairs/{mark['id']}"


def marks(conn: SyncConn, *, dry_run: bool, now: datetime, limit: int = 50) -> list[Row]:
    """The marks this mode has yet to answer."""
    return store.repair_marks(conn, dry_run=dry_run, since=now - LOOKBACK, limit=limit)


def answer(conn: SyncConn, mark: Row, *, dry_run: bool, now: datetime) -> list[dict[str, Any]]:
    """Answer one mark in the caller's transaction: withdraw what it made moot, validate the node it
    holds out; the records written (none when another remediator answered it first)."""
    told = Told.of(mark)
    active = store.active_plan(conn, told.node, dry_run)
    withdrawn, left = withdraw_moot(conn, told, active, dry_run=dry_run, now=now)
    if withdrawn:  # the node's plan was the one the repair made moot: none is in hand now
        active = None
    reply = respond(conn, told, active, left, withdrawn, dry_run=dry_run, now=now)
    return write_answer(conn, told, reply, withdrawn, dry_run=dry_run, now=now)


@dataclass(frozen=True, slots=True)
class Told:
    """A mark as its answer names it: the node and GPU, the decision's key, who said what when, and the
    answers its records carry."""

    mark: Row
    node: str
    gpu: str
    key: str
    said: str
    answers: dict[str, Any]

    @classmethod
    def of(cls, mark: Row) -> Told:
        message = {k: mark[k] for k in ("id", "gpu_uuid", "kind", "marked_by", "note")}
        key = key_of(mark)
        return cls(
            mark=mark,
            node=str(mark["node"]),
            gpu=str(mark["gpu_uuid"]),
            key=key,
            said=f"{mark['kind']} by {mark['marked_by']} at {mark['time']:%Y-%m-%d %H:%M:%S} UTC",
            answers={
                "decision_key": key,
                "topic": "gpu_repairs",
                "message": {**message, "time": validation.iso(mark["time"])},
            },
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """What the mark is answered with: the decision's outcome, its action, the plan in hand, and why."""

    outcome: str  # joined, act, ignored
    action: str
    plan_id: int | None
    reason: str


def withdraw_moot(
    conn: SyncConn, told: Told, active: Row | None, *, dry_run: bool, now: datetime
) -> tuple[list[dict[str, Any]], Row | None]:
    """The node's plan held for an operator, if the repair made it moot (it takes in the repaired GPU and
    predates the mark), withdrawn: (its record, or none, and the plan it escalated from, which left the
    node out)."""
    if not (
        active is not None
        and active["state"] == "held"
        and told.gpu in active["gpu_uuids"]
        and active["created_at"] <= told.mark["time"]
    ):
        return [], None
    store.withdraw(conn, int(active["id"]), now)
    why = f"GPU {told.gpu} {told.said}: the repair made this {active['action']} moot"
    record = event(
        "outcome", at=now, status="withdrawn", dry_run=dry_run, plan=active, reason=why, seconds=0.0
    )
    left = None
    if active["escalated_from"] is not None:  # the plan it escalated from left the node out
        left = store.plan(conn, int(active["escalated_from"]))
    return [record], left


def respond(
    conn: SyncConn,
    told: Told,
    active: Row | None,
    left: Row | None,
    withdrawn: list[dict[str, Any]],
    *,
    dry_run: bool,
    now: datetime,
) -> Reply:
    """The plan in hand judges the repaired GPU; else a node left out for a person is validated (`left`,
    or the node's plan that left it out); else the node is not held out."""
    if active is not None:
        plan_id, action = int(active["id"]), str(active["action"])
        reason = f"plan {plan_id} ({action}, {active['state']}) is in hand: it judges the repaired GPU"
        return Reply("joined", action, plan_id, reason)
    if (left := left or store.left_out_for_a_person(conn, told.node, dry_run, marks=False)) is not None:
        return validate(conn, told, left, dry_run=dry_run, now=now)
    withdrew = f"plan {withdrawn[0]['remediation_id']} withdrawn; " if withdrawn else ""
    return Reply(
        "ignored", "none", None, f"GPU {told.gpu} {told.said}: {withdrew}{told.node} is not held out"
    )


def validate(conn: SyncConn, told: Told, left: Row, *, dry_run: bool, now: datetime) -> Reply:
    """A validation plan for the node `left` left out: the GPUs seen again, the compute check and healthy
    cycles after the mark, then the node returns."""
    action = str(left["action"])
    plan_id = store.create_plan(
        conn,
        node=told.node,
        gpu_uuids=list(left["gpu_uuids"]),
        action=action,
        finding=str(left["finding"]),
        steps=["validate", "return"],
        state="running",
        held_for=None,
        dry_run=dry_run,
        decision_key=told.key,
        at=now,
        detail={
            "answers": told.answers,
            "identity": store.host_gpus(conn, told.node),
            "after_repair": int(told.mark["id"]),
            "validation": {"remedied_at": validation.iso(told.mark["time"])},
        },
    )
    reason = (
        f"GPU {told.gpu} {told.said}: {told.node}, left out by plan {left['id']},"
        " is validated and returns if it passes"
    )
    return Reply("act", action, plan_id, reason)


def write_answer(
    conn: SyncConn, told: Told, reply: Reply, withdrawn: list[dict[str, Any]], *, dry_run: bool, now: datetime
) -> list[dict[str, Any]]:
    """The decision's row, and the records (what was withdrawn, then the decision); none, rolled back,
    when another remediator of this mode answered the mark first."""
    if not store.insert_decision(
        conn,
        decision_key=told.key,
        at=now,
        gpu_uuid=told.gpu,
        node=told.node,
        action=reply.action,
        outcome=reply.outcome,
        remediation_id=reply.plan_id,
        reason=reply.reason,
        dry_run=dry_run,
    ):
        conn.rollback()
        return []
    decision = event(
        "decision",
        at=now,
        status=reply.outcome,
        dry_run=dry_run,
        node=told.node,
        gpu_uuid=told.gpu,
        action=reply.action,
        reason=reply.reason,
        answers=told.answers,
    )
    decision["remediation_id"] = reply.plan_id
    ledger.insert_events(conn, [*withdrawn, decision])
    return [*withdrawn, decision]

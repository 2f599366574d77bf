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
    node, gpu, key = str(mark["node"]), str(mark["gpu_uuid"]), key_of(mark)
    said = f"{mark['kind']} by {mark['marked_by']} at {mark['time']:%Y-%m-%d %H:%M:%S} UTC"
    message = {k: mark[k] for k in ("id", "gpu_uuid", "kind", "marked_by", "note")}
    answers = {
        "decision_key": key,
        "topic": "gpu_repairs",
        "message": {**message, "time": validation.iso(mark["time"])},
    }
    records: list[dict[str, Any]] = []
    active = store.active_plan(conn, node, dry_run)
    left: Row | None = None
    if (
        active is not None
        and active["state"] == "held"
        and gpu in active["gpu_uuids"]
        and active["created_at"] <= mark["time"]
    ):
        store.withdraw(conn, int(active["id"]), now)
        why = f"GPU {gpu} {said}: the repair made this {active['action']} moot"
        records.append(
            event(
                "outcome", at=now, status="withdrawn", dry_run=dry_run, plan=active, reason=why, seconds=0.0
            )
        )
        if active["escalated_from"] is not None:  # the plan it escalated from left the node out
            left = store.plan(conn, int(active["escalated_from"]))
        active = None
    plan_id: int | None = None
    if active is not None:
        outcome, action = "joined", str(active["action"])
        plan_id = int(active["id"])
        reason = f"plan {plan_id} ({action}, {active['state']}) is in hand: it judges the repaired GPU"
    elif (left := left or store.left_out_for_a_person(conn, node, dry_run, marks=False)) is not None:
        outcome, action = "act", str(left["action"])
        plan_id = store.create_plan(
            conn,
            node=node,
            gpu_uuids=list(left["gpu_uuids"]),
            action=action,
            finding=str(left["finding"]),
            steps=["validate", "return"],
            state="running",
            held_for=None,
            dry_run=dry_run,
            decision_key=key,
            at=now,
            detail={
                "answers": answers,
                "identity": store.host_gpus(conn, node),
                "after_repair": int(mark["id"]),
                "validation": {"remedied_at": validation.iso(mark["time"])},
            },
        )
        reason = (
            f"GPU {gpu} {said}: {node}, left out by plan {left['id']}, is validated and returns if it passes"
        )
    else:
        withdrew = f"plan {records[0]['remediation_id']} withdrawn; " if records else ""
        outcome, action, reason = "ignored", "none", f"GPU {gpu} {said}: {withdrew}{node} is not held out"
    if not store.insert_decision(
        conn,
        decision_key=key,
        at=now,
        gpu_uuid=gpu,
        node=node,
        action=action,
        outcome=outcome,
        remediation_id=plan_id,
        reason=reason,
        dry_run=dry_run,
    ):
        conn.rollback()  # another remediator of this mode answered it first
        return []
    decision = event(
        "decision",
        at=now,
        status=outcome,
        dry_run=dry_run,
        node=node,
        gpu_uuid=gpu,
        action=action,
        reason=reason,
        answers=answers,
    )
    decision["remediation_id"] = plan_id
    ledger.insert_events(conn, [*records, decision])
    return [*records, decision]

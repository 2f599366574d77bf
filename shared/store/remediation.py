"""The remediator's decisions, plans and ownership (schema/0030): what it answered, is doing, and owns.

A decision is keyed by the verdict or alert it answers and the mode (dry run
or live), so a redelivered message finds its decision and nothing happens
twice, and a dry run beside a live remediator never takes the live one's. A plan (`remediations`)
is one node's remediation, a state machine the remediator steps through and a
restart resumes. `remediation_ownership` holds the cordons and drains the
remediator made itself: the only ones it may undo. The reads of gpu_assets,
gpu_latest and gpu_status here are the ones the decisions and the validation
need. Writes run in the caller's transaction (no commit here).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .errors import translated
from .results import Row, dict_rows, tuple_rows

SyncConn = psycopg.Connection[Any]

_PLAN_COLUMNS = (
    "id, node, gpu_uuids, action, finding, steps, step, state, held_for, dry_run, decision_key,"
    " escalated_from, created_at, updated_at, next_at, step_started_at, approved_by, approved_at, detail"
)


def decided(conn: SyncConn, decision_key: str, dry_run: bool) -> Row | None:
    """The decision this mode already took for this verdict or alert, if any."""
    found = dict_rows(
        conn,
        "SELECT * FROM remediation_decisions WHERE decision_key = %s AND dry_run = %s",
        (decision_key, dry_run),
    )
    return found[0] if found else None


def insert_decision(
    conn: SyncConn,
    *,
    decision_key: str,
    at: datetime,
    gpu_uuid: str,
    node: str,
    action: str,
    outcome: str,
    remediation_id: int | None,
    reason: str | None,
    dry_run: bool,
) -> bool:
    """Record a decision; False when this mode had one for the key already (a concurrent consumer)."""
    found = tuple_rows(
        conn,
        "INSERT INTO remediation_decisions (decision_key, decided_at, gpu_uuid, node, action, outcome,"
        " remediation_id, reason, dry_run) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (decision_key, dry_run) DO NOTHING RETURNING 1",
        (decision_key, at, gpu_uuid, node, action, outcome, remediation_id, reason, dry_run),
    )
    return bool(found)


def active_plan(conn: SyncConn, node: str, dry_run: bool) -> Row | None:
    """The node's plan in hand (held or running), locked for this transaction."""
    found = dict_rows(
        conn,
        f"SELECT {_PLAN_COLUMNS} FROM remediations WHERE node = %s AND dry_run = %s"
        " AND state IN ('held', 'running') FOR UPDATE",
        (node, dry_run),
    )
    return found[0] if found else None


def create_plan(
    conn: SyncConn,
    *,
    node: str,
    gpu_uuids: Sequence[str],
    action: str,
    finding: str,
    steps: Sequence[str],
    state: str,
    held_for: str | None,
    dry_run: bool,
    decision_key: str,
    at: datetime,
    detail: dict[str, Any],
    escalated_from: int | None = None,
) -> int:
    """A new plan for `node`; its id. The node must have none in hand (a unique index says so)."""
    ((plan_id,),) = tuple_rows(
        conn,
        "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, held_for, dry_run,"
        " decision_key, escalated_from, created_at, updated_at, next_at, detail)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (
            node,
            list(gpu_uuids),
            action,
            finding,
            list(steps),
            state,
            held_for,
            dry_run,
            decision_key,
            escalated_from,
            at,
            at,
            at,
            Jsonb(detail),
        ),
    )
    return int(plan_id)


def join_plan(conn: SyncConn, plan_id: int, gpu_uuid: str, at: datetime) -> None:
    """Add a GPU to a plan in hand (a second finding on the same node)."""
    with translated(conn):
        conn.execute(
            "UPDATE remediations SET gpu_uuids = array_append(gpu_uuids, %s), updated_at = %s"
            " WHERE id = %s AND NOT (%s = ANY (gpu_uuids))",
            (gpu_uuid, at, plan_id, gpu_uuid),
        )


def left_out_for_a_person(conn: SyncConn, node: str, dry_run: bool, *, marks: bool = True) -> Row | None:
    """The node's newest finished plan, when it left the node out for a person and (with `marks`) nobody
    has said since that a GPU of it was repaired or returned (gpu_repairs): failed, escalated with no
    plan after it, or done with keep_out as its last step. None when the node's last plan returned it
    (or a repair mark came after it), or it had none."""
    found = dict_rows(
        conn,
        f"SELECT {_PLAN_COLUMNS} FROM ("
        f" SELECT {_PLAN_COLUMNS} FROM remediations WHERE node = %s AND dry_run = %s"
        "  AND state IN ('done', 'failed', 'escalated') ORDER BY updated_at DESC, id DESC LIMIT 1) AS newest"
        " WHERE (state = 'failed'"
        "  OR (state = 'done' AND steps[array_upper(steps, 1)] = 'keep_out')"
        "  OR (state = 'escalated'"
        "   AND NOT EXISTS (SELECT 1 FROM remediations AS later WHERE later.escalated_from = newest.id)))"
        " AND (NOT %s OR NOT EXISTS (SELECT 1 FROM gpu_repairs AS mark"
        "  WHERE mark.gpu_uuid = ANY (newest.gpu_uuids) AND mark.time > newest.updated_at))",
        (node, dry_run, marks),
    )
    return found[0] if found else None


def repair_marks(conn: SyncConn, *, dry_run: bool, since: datetime, limit: int) -> list[Row]:
    """Operators' repair and return marks since `since` on GPUs of nodes this mode had a plan on before
    the mark, that this mode has not answered yet (a decision keyed `gpu_repairs/<id>`), oldest first."""
    return dict_rows(
        conn,
        "SELECT m.id, m.gpu_uuid, m.time, m.kind, m.marked_by, m.note, a.hostname AS node"
        " FROM gpu_repairs m JOIN gpu_assets a USING (gpu_uuid)"
        " WHERE m.time > %(since)s AND NOT EXISTS (SELECT FROM remediation_decisions d"
        "  WHERE d.decision_key = 'gpu_repairs/' || m.id AND d.dry_run = %(d)s)"
        " AND EXISTS (SELECT FROM remediations r"
        "  WHERE r.node = a.hostname AND r.dry_run = %(d)s AND r.created_at <= m.time)"
        " ORDER BY m.time, m.id LIMIT %(limit)s",
        {"since": since, "d": dry_run, "limit": limit},
    )


def start_held_plan(conn: SyncConn, plan_id: int, at: datetime) -> None:
    """A plan held for approval starts without one (services/remediator/decide.py's `start_held` says
    why, on the record)."""
    with translated(conn):
        conn.execute(
            "UPDATE remediations SET state = 'running', held_for = NULL, next_at = %s, updated_at = %s"
            " WHERE id = %s AND state = 'held'",
            (at, at, plan_id),
        )


def escalate_plan(conn: SyncConn, plan_id: int, at: datetime) -> None:
    """A plan in hand ends escalated: a plan one rung up takes its node (opened by the caller)."""
    with translated(conn):
        conn.execute(
            "UPDATE remediations SET state = 'escalated', updated_at = %s WHERE id = %s", (at, plan_id)
        )


def withdraw(conn: SyncConn, plan_id: int, at: datetime) -> None:
    """A held plan ends without a step taken (what it answered is moot)."""
    with translated(conn):
        conn.execute(
            "UPDATE remediations SET state = 'withdrawn', updated_at = %s WHERE id = %s AND state = 'held'",
            (at, plan_id),
        )


def plans_since(
    conn: SyncConn, *, dry_run: bool, since: datetime, node: str | None = None, action: str | None = None
) -> int:
    """Plans started since `since` (held ones have not started; a validation after a repair takes no node
    out), on one node or of one action (the limits)."""
    ((count,),) = tuple_rows(
        conn,
        "SELECT count(*) FROM remediations WHERE dry_run = %(d)s AND created_at > %(s)s AND held_for IS NULL"
        " AND NOT detail ? 'after_repair'"
        " AND (%(n)s::text IS NULL OR node = %(n)s) AND (%(a)s::text IS NULL OR action = %(a)s)",
        {"d": dry_run, "s": since, "n": node, "a": action},
    )
    return int(count)


def plan(conn: SyncConn, plan_id: int) -> Row | None:
    found = dict_rows(conn, f"SELECT {_PLAN_COLUMNS} FROM remediations WHERE id = %s", (plan_id,))
    return found[0] if found else None


def due_plans(conn: SyncConn, *, dry_run: bool, now: datetime, limit: int) -> list[int]:
    """The running plans whose step is due, oldest first (each is locked by `lock_due` before it runs)."""
    found = tuple_rows(
        conn,
        "SELECT id FROM remediations WHERE state = 'running' AND dry_run = %s AND next_at <= %s"
        " ORDER BY next_at, id LIMIT %s",
        (dry_run, now, limit),
    )
    return [int(plan_id) for (plan_id,) in found]


def lock_due(conn: SyncConn, plan_id: int, now: datetime) -> Row | None:
    """The plan, locked for this transaction, if it is still running and due (and no one else holds it)."""
    found = dict_rows(
        conn,
        f"SELECT {_PLAN_COLUMNS} FROM remediations WHERE id = %s AND state = 'running' AND next_at <= %s"
        " FOR UPDATE SKIP LOCKED",
        (plan_id, now),
    )
    return found[0] if found else None


def update_plan(
    conn: SyncConn,
    plan_id: int,
    *,
    at: datetime,
    step: int,
    state: str,
    held_for: str | None,
    next_at: datetime,
    step_started_at: datetime | None,
    detail: dict[str, Any],
) -> None:
    with translated(conn):
        conn.execute(
            "UPDATE remediations SET step = %s, state = %s, held_for = %s, next_at = %s,"
            " step_started_at = %s, detail = %s, updated_at = %s WHERE id = %s",
            (step, state, held_for, next_at, step_started_at, Jsonb(detail), at, plan_id),
        )


def own(conn: SyncConn, *, node: str, scheduler: str, dry_run: bool, plan_id: int, at: datetime) -> None:
    """Note a cordon or drain as the remediator's own (a later plan on the node takes it over)."""
    with translated(conn):
        conn.execute(
            "INSERT INTO remediation_ownership (node, scheduler, dry_run, remediation_id, since)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (node, scheduler, dry_run)"
            " DO UPDATE SET remediation_id = EXCLUDED.remediation_id",
            (node, scheduler, dry_run, plan_id, at),
        )


def owned(conn: SyncConn, *, node: str, scheduler: str, dry_run: bool) -> bool:
    found = tuple_rows(
        conn,
        "SELECT 1 FROM remediation_ownership WHERE node = %s AND scheduler = %s AND dry_run = %s",
        (node, scheduler, dry_run),
    )
    return bool(found)


def holds_node(conn: SyncConn, node: str, dry_run: bool) -> bool:
    """Whether this mode holds `node` out in any scheduler (it cordoned or drained it, and has not
    returned it)."""
    found = tuple_rows(
        conn, "SELECT 1 FROM remediation_ownership WHERE node = %s AND dry_run = %s", (node, dry_run)
    )
    return bool(found)


def disown(conn: SyncConn, *, node: str, scheduler: str, dry_run: bool) -> None:
    with translated(conn):
        conn.execute(
            "DELETE FROM remediation_ownership WHERE node = %s AND scheduler = %s AND dry_run = %s",
            (node, scheduler, dry_run),
        )


def gpu_hostname(conn: SyncConn, gpu_uuid: str) -> str | None:
    """The inventory's hostname of a GPU (gpu_assets), None when it does not know it."""
    found = tuple_rows(conn, "SELECT hostname FROM gpu_assets WHERE gpu_uuid = %s", (gpu_uuid,))
    return str(found[0][0]) if found else None


def host_gpus(conn: SyncConn, hostname: str) -> dict[str, int]:
    """The GPUs the inventory places on `hostname`: UUID -> index."""
    found = tuple_rows(conn, "SELECT gpu_uuid, gpu_index FROM gpu_assets WHERE hostname = %s", (hostname,))
    return {str(uuid): int(index) for uuid, index in found}


def last_seen(conn: SyncConn, hostname: str) -> dict[str, datetime]:
    """Each GPU of `hostname` with the time of its newest sample (gpu_latest)."""
    found = tuple_rows(conn, "SELECT gpu_uuid, time FROM gpu_latest WHERE hostname = %s", (hostname,))
    return {str(uuid): time for uuid, time in found}


def statuses(conn: SyncConn, gpu_uuids: Sequence[str]) -> list[tuple[str, str, datetime]]:
    """Each GPU's state as of the scorer's last cycle (gpu_status): (uuid, state, as_of)."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, state, as_of FROM gpu_status WHERE gpu_uuid = ANY (%s) ORDER BY gpu_uuid",
        (list(gpu_uuids),),
    )
    return [(str(u), str(s), a) for u, s, a in found]


def approve_plan(conn: SyncConn, plan_id: int, *, at: datetime, by: str) -> bool:
    """Approve one held plan as of `at`, whatever held it (the evaluation's simulated person, on its clock;
    the API approves through remediation_approve, as of now); False when it is no longer held."""
    found = tuple_rows(
        conn,
        "UPDATE remediations SET state = 'running', held_for = NULL, approved_by = %s, approved_at = %s,"
        " next_at = %s, updated_at = %s WHERE id = %s AND state = 'held' AND NOT dry_run RETURNING id",
        (by, at, at, at, plan_id),
    )
    return bool(found)


def approve_waiting(conn: SyncConn, *, dry_run: bool, decided_before: datetime, at: datetime, by: str) -> int:
    """Approve, as of `at`, the plans held for approval since before `decided_before` (the evaluation's
    simulated operator; the API approves one plan at a time through remediation_approve)."""
    found = tuple_rows(
        conn,
        "UPDATE remediations SET state = 'running', held_for = NULL, approved_by = %s, approved_at = %s,"
        " next_at = %s, updated_at = %s WHERE state = 'held' AND held_for = 'approval' AND dry_run = %s"
        " AND created_at <= %s RETURNING id",
        (by, at, at, at, dry_run, decided_before),
    )
    return len(found)


def plans_in_state(conn: SyncConn, state: str, *, dry_run: bool) -> list[tuple[int, str]]:
    """(id, node) of the mode's plans in `state`, oldest first (the evaluation's simulated operator)."""
    with translated(conn):
        rows = conn.execute(
            "SELECT id, node FROM remediations WHERE state = %s AND dry_run = %s ORDER BY id",
            (state, dry_run),
        ).fetchall()
    return [(int(plan_id), str(node)) for plan_id, node in rows]

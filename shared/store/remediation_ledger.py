"""The remediator's record (remediation_events), its outbox to gpu-remediations, the pause and the breaker.

Every record is written in the transaction of what it records and published
afterwards from the outbox (`published` false until the broker has it), so a
crash between the two publishes it late, never loses it. The control row per
mode (dry run or live) holds the pause and the breaker; the breaker's window
counts `remediation_breaker_admissions`. The API reads the plans and the
control through the reader login and changes them only through the
SECURITY DEFINER functions of schema/0030, as the acknowledging login.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .errors import translated
from .results import Row, dict_rows, dict_rows_async, tuple_rows

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]

EVENT_COLUMNS = (
    "time",
    "record_id",
    "kind",
    "remediation_id",
    "gpu_uuid",
    "node",
    "action",
    "step",
    "driver",
    "status",
    "dry_run",
    "reason",
    "seconds",
    "answers",
    "response",
)
_JSON_COLUMNS = frozenset({"answers", "response"})


def insert_events(conn: SyncConn, events: Sequence[dict[str, Any]]) -> None:
    """Record events (each a dict of EVENT_COLUMNS), unpublished."""
    if not events:
        return
    rows = [
        tuple(Jsonb(e[c]) if c in _JSON_COLUMNS and e[c] is not None else e[c] for c in EVENT_COLUMNS)
        for e in events
    ]
    with translated(conn), conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO remediation_events ({', '.join(EVENT_COLUMNS)})"
            f" VALUES ({', '.join(['%s'] * len(EVENT_COLUMNS))})",
            rows,
        )


def outbox(conn: SyncConn, limit: int) -> list[Row]:
    """Unpublished events, oldest first, locked for this transaction (another remediator skips them)."""
    return dict_rows(
        conn,
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM remediation_events WHERE NOT published"
        " ORDER BY time, record_id LIMIT %s FOR UPDATE SKIP LOCKED",
        (limit,),
    )


def mark_published(conn: SyncConn, keys: Sequence[tuple[Any, datetime]]) -> None:
    """The events (record_id, time) the broker acknowledged."""
    if not keys:
        return
    with translated(conn):
        conn.execute(
            "UPDATE remediation_events e SET published = true"
            " FROM unnest(%s::uuid[], %s::timestamptz[]) k(r, t) WHERE e.record_id = k.r AND e.time = k.t",
            ([str(r) for r, _ in keys], [t for _, t in keys]),
        )


def control(conn: SyncConn, dry_run: bool, *, lock: bool = False) -> Row:
    """The pause and breaker of one mode; `lock` holds the row until the transaction ends (through
    remediation_control_held: the remediator's login may not update the row, so not lock it itself)."""
    (row,) = dict_rows(
        conn,
        "SELECT * FROM remediation_control_held(%s)"
        if lock
        else "SELECT * FROM remediation_control WHERE dry_run = %s",
        (dry_run,),
    )
    return row


def breaker_window(conn: SyncConn, dry_run: bool, since: datetime) -> set[str]:
    """The nodes admitted to a cordon or drain since `since`."""
    found = tuple_rows(
        conn,
        "SELECT DISTINCT node FROM remediation_breaker_admissions WHERE dry_run = %s AND time > %s",
        (dry_run, since),
    )
    return {str(node) for (node,) in found}


def nodes_held_out(conn: SyncConn, dry_run: bool) -> set[str]:
    """The nodes the remediator holds out of service in a mode: its own cordons (live), the nodes of its
    plans in hand past their cordon, and those its newest finished plan on the node left out for a person
    (failed, escalated with no plan after it, or done with keep_out)."""
    found = tuple_rows(
        conn,
        "SELECT node FROM remediation_ownership WHERE dry_run = %(d)s"
        " UNION SELECT node FROM remediations WHERE dry_run = %(d)s AND state IN ('held', 'running')"
        "  AND step > 0 AND steps[1] = 'cordon'"
        " UNION SELECT node FROM ("
        "  SELECT DISTINCT ON (node) id, node, state, steps FROM remediations"
        "  WHERE dry_run = %(d)s AND state IN ('done', 'failed', 'escalated')"
        "  ORDER BY node, updated_at DESC, id DESC) AS newest"
        "  WHERE steps[1] = 'cordon' AND (state = 'failed'"
        "   OR (state = 'done' AND steps[array_upper(steps, 1)] = 'keep_out')"
        "   OR (state = 'escalated'"
        "    AND NOT EXISTS (SELECT 1 FROM remediations AS later WHERE later.escalated_from = newest.id)))",
        {"d": dry_run},
    )
    return {str(node) for (node,) in found}


def admit(conn: SyncConn, *, node: str, dry_run: bool, plan_id: int, at: datetime) -> None:
    with translated(conn):
        conn.execute(
            "INSERT INTO remediation_breaker_admissions (time, node, dry_run, remediation_id)"
            " VALUES (%s, %s, %s, %s)",
            (at, node, dry_run, plan_id),
        )


def trip(conn: SyncConn, *, dry_run: bool, reason: str, at: datetime) -> None:
    """Open the breaker (the caller holds the control row), through remediation_trip_breaker: the only
    write to its controls the remediator's login may make."""
    with translated(conn):
        conn.execute("SELECT FROM remediation_trip_breaker(%s, %s, %s)", (dry_run, reason, at))


def fleet_nodes(conn: SyncConn) -> int:
    """The nodes in the inventory (gpu_assets): the fleet the breaker's percentage is of."""
    ((count,),) = tuple_rows(conn, "SELECT count(DISTINCT hostname) FROM gpu_assets")
    return int(count)


# --- the API -------------------------------------------------------------------------------------


_PLAN_BRIEF = (
    "id, node, gpu_uuids, action, finding, steps, step, state, held_for, dry_run, escalated_from,"
    " created_at, updated_at, step_started_at, approved_by, approved_at"
)


async def plans_page(
    conn: AsyncConn, *, states: Sequence[str], dry_run: bool | None, limit: int, before: int | None
) -> list[Row]:
    """Plans in `states`, newest first, after the cursor's id."""
    return await dict_rows_async(
        conn,
        f"SELECT {_PLAN_BRIEF} FROM remediations WHERE state = ANY (%(s)s)"
        " AND (%(d)s::boolean IS NULL OR dry_run = %(d)s) AND (%(b)s::bigint IS NULL OR id < %(b)s)"
        " ORDER BY id DESC LIMIT %(l)s",
        {"s": list(states), "d": dry_run, "b": before, "l": limit},
    )


async def plans_count(conn: AsyncConn, *, states: Sequence[str], dry_run: bool | None) -> int:
    (row,) = await dict_rows_async(
        conn,
        "SELECT count(*) AS n FROM remediations WHERE state = ANY (%(s)s)"
        " AND (%(d)s::boolean IS NULL OR dry_run = %(d)s)",
        {"s": list(states), "d": dry_run},
    )
    return int(row["n"])


async def plan_brief(conn: AsyncConn, plan_id: int) -> Row | None:
    found = await dict_rows_async(conn, f"SELECT {_PLAN_BRIEF} FROM remediations WHERE id = %s", (plan_id,))
    return found[0] if found else None


async def plan_with_events(conn: AsyncConn, plan_id: int) -> Row | None:
    """One plan, with its record in order."""
    found = await dict_rows_async(conn, "SELECT * FROM remediations WHERE id = %s", (plan_id,))
    if not found:
        return None
    events = await dict_rows_async(
        conn,
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM remediation_events WHERE remediation_id = %s"
        " ORDER BY time, record_id LIMIT 1000",
        (plan_id,),
    )
    return {**found[0], "events": events}


async def controls(conn: AsyncConn) -> list[Row]:
    """The pause and the breaker of each mode (dry run and live)."""
    return await dict_rows_async(conn, "SELECT * FROM remediation_control ORDER BY dry_run")


async def operate(conn: AsyncConn, what: str, who: str) -> list[Row]:
    """Pause, resume or reset the breaker (the acknowledging login); the control rows after it."""
    function = {
        "pause": "remediation_pause",
        "resume": "remediation_resume",
        "reset": "remediation_reset_breaker",
    }[what]
    return await dict_rows_async(conn, f"SELECT * FROM {function}(%s)", (who,))


async def approve(conn: AsyncConn, plan_id: int, who: str) -> Row | None:
    """Approve a held plan (the acknowledging login); None when it is not held."""
    found = await dict_rows_async(conn, "SELECT id, state FROM remediation_approve(%s, %s)", (plan_id, who))
    return found[0] if found else None


async def plan_state(conn: AsyncConn, plan_id: int) -> str | None:
    found = await dict_rows_async(conn, "SELECT state FROM remediations WHERE id = %s", (plan_id,))
    return str(found[0]["state"]) if found else None


def plan_timeline(conn: SyncConn, dry_run: bool) -> list[Row]:
    """Every plan of a mode with when it was decided, cordoned and drained (the evaluation's record)."""
    return dict_rows(
        conn,
        "SELECT r.id, r.node, r.gpu_uuids, r.action, r.state, r.held_for, r.created_at,"
        " min(e.time) FILTER (WHERE e.step = 'cordon') AS cordoned_at,"
        " min(e.time) FILTER (WHERE e.step = 'drain') AS drained_at"
        " FROM remediations r LEFT JOIN remediation_events e ON e.remediation_id = r.id AND e.kind = 'action'"
        " AND e.status IN ('ok', 'dry_run', 'not_owned')"
        " WHERE r.dry_run = %s GROUP BY r.id ORDER BY r.id",
        (dry_run,),
    )

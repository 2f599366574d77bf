"""gpu_events: the sink's staging table for a batch's events, and the inserts that store each event once.

Two writers store events, and whichever comes first stores it: the sink (a
batch, staged) and the scorer's event fast path (the events it is about to
judge, so its judgement reads them from the database like every other input).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from shared.contract.models import GpuEvent

from .errors import translated
from .samples import TEXT, Cursor, Stage, ident_list

EVENT_COLUMNS: tuple[str, ...] = (
    "time",
    "gpu_uuid",
    "kind",
    "hostname",
    "cluster",
    "datacenter",
    "rack",
    "source",
    "collector_id",
    "details",
)
EVENT_TYPES: tuple[str, ...] = ("timestamptz", *([TEXT] * 8), "jsonb")
EVENTS_STAGE = Stage("_stage_events", EVENT_COLUMNS, EVENT_TYPES)

_event_plain = attrgetter(*EVENT_COLUMNS[:-1])


def event_row(e: GpuEvent) -> tuple[Any, ...]:
    """An event as a gpu_events row, in EVENT_COLUMNS' order."""
    return (*_event_plain(e), Jsonb(e.details))


# A folded XID (services/collector/xid_fold.py) arrives first as its first line, then again with the
# flood's count: the revision with the higher count wins, so a replay, or revisions out of order,
# never lower a stored count. Anything else stored is never changed.
LINES = "coalesce((details->>'count')::bigint, 1)"  # the kernel-log lines a stored XID event stands for
LAST = "coalesce((details->>'last')::timestamptz, time)"  # the time of its last line
_REVISE = sql.SQL(
    " ON CONFLICT (gpu_uuid, time, kind) DO UPDATE SET details = excluded.details"
    " WHERE gpu_events.kind = 'xid' AND {new} > {old}"
).format(
    new=sql.SQL(LINES.replace("details", "excluded.details")),
    old=sql.SQL(LINES.replace("details", "gpu_events.details")),
)
# One statement may touch a row once: of a batch's revisions of one event, the highest count goes.
_INSERT_STAGED = (
    sql.SQL(
        "INSERT INTO gpu_events ({c}) SELECT DISTINCT ON (gpu_uuid, time, kind) {c} FROM _stage_events"
        " ORDER BY gpu_uuid, time, kind, {lines} DESC"
    ).format(c=ident_list(EVENT_COLUMNS), lines=sql.SQL(LINES))
    + _REVISE
)


def insert_staged(cur: Cursor) -> int:
    """The staged events into gpu_events, a replayed one adding nothing; the rows inserted or revised."""
    with translated(cur.connection):
        cur.execute(_INSERT_STAGED)
        return cur.rowcount


_INSERT = (
    sql.SQL("INSERT INTO gpu_events ({c}) VALUES ({v})").format(
        c=ident_list(EVENT_COLUMNS), v=sql.SQL(", ").join(sql.Placeholder() * len(EVENT_COLUMNS))
    )
    + _REVISE
)


def insert_events(conn: psycopg.Connection[Any], found: Sequence[GpuEvent]) -> None:
    """`found` into gpu_events, each one stored once whoever stores it first (a folded XID's higher
    count revising it); no commit."""
    with translated(conn), conn.cursor() as cur:
        cur.executemany(_INSERT, [event_row(e) for e in found])


def xid_lines(conn: psycopg.Connection[Any], gpu_uuid: str, code: int) -> tuple[int, int]:
    """One GPU's stored events of one XID: how many rows, and the lines they count (folded floods whole)."""
    with translated(conn), conn.cursor() as cur:
        cur.execute(
            sql.SQL(
                "SELECT count(*), coalesce(sum({lines}), 0) FROM gpu_events"
                " WHERE kind = 'xid' AND gpu_uuid = %s AND details->>'xid' = %s"
            ).format(lines=sql.SQL(LINES)),
            (gpu_uuid, str(code)),
        )
        rows, lines = cur.fetchone() or (0, 0)
    return int(rows), int(lines)


def xids_elsewhere(conn: psycopg.Connection[Any], gpu_uuid: str) -> list[tuple[str, int]]:
    """Every other GPU's stored XID events, one (GPU, code) a row."""
    with translated(conn), conn.cursor() as cur:
        cur.execute(
            "SELECT gpu_uuid, (details->>'xid')::int FROM gpu_events WHERE kind = 'xid' AND gpu_uuid <> %s",
            (gpu_uuid,),
        )
        return [(str(gpu), int(code)) for gpu, code in cur.fetchall()]

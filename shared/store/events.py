"""gpu_events: the sink's staging table for a batch's events and the insert that stores them once."""

from __future__ import annotations

from psycopg import sql

from .errors import translated
from .samples import TEXT, Cursor, Stage, ident_list

EVENT_COLUMNS: tuple[str, ...] = (
    "time", "gpu_uuid", "kind", "hostname", "cluster", "datacenter", "rack", "source",
    "collector_id", "details",
)  # fmt: skip
EVENT_TYPES: tuple[str, ...] = ("timestamptz", *([TEXT] * 8), "jsonb")
EVENTS_STAGE = Stage("_stage_events", EVENT_COLUMNS, EVENT_TYPES)

_INSERT_STAGED = sql.SQL(
    "INSERT INTO gpu_events ({c}) SELECT {c} FROM _stage_events ON CONFLICT (gpu_uuid, time, kind) DO NOTHING"
).format(c=ident_list(EVENT_COLUMNS))


def insert_staged(cur: Cursor) -> int:
    """The staged events into gpu_events, a replayed one adding nothing; the rows inserted."""
    with translated(cur.connection):
        cur.execute(_INSERT_STAGED)
        return cur.rowcount

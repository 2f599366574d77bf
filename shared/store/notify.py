"""The scorer's announcement of a committed cycle, and the API cache's listening for it.

The scorer calls `announce_scored` inside its cycle's transaction: PostgreSQL
delivers the notification at the commit, so a listener never hears of a cycle
it cannot read yet. The payload is the schema the cycle was written in, so
listeners on a shared server (tests, benches in scratch schemas) hear only their own.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from .errors import translated

CHANNEL = "gpuhealth_scored"


def announce_scored(conn: psycopg.Connection[Any]) -> None:
    """Announce, at this transaction's commit, that a scoring cycle was written (payload: the schema)."""
    with translated(conn):
        conn.execute("SELECT pg_notify(%s, current_schema())", (CHANNEL,))


async def listen_scored(conn: psycopg.AsyncConnection[Any]) -> str | None:
    """Start listening for announced cycles on `conn` (autocommit); the schema whose announcements count."""
    with translated(conn):
        async with conn.cursor(row_factory=tuple_row) as cur:
            row = await (await cur.execute("SELECT current_schema()")).fetchone()
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
    return None if row is None else str(row[0])

"""Operator repair marks (gpu_repairs, schema/0031): written through the API, read by the API and the scorer.

A mark says a GPU was repaired in place or came back from repair. The scorer
counts nothing before a GPU's newest mark (shared.store.verdict_inputs), so its
findings resolve and its repeat counters start again; the marks themselves are
the audit trail.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import psycopg

from .results import Row, dict_rows_async

AsyncConn = psycopg.AsyncConnection[Any]
SyncConn = psycopg.Connection[Any]
RepairKind = Literal["repaired", "returned"]


async def mark(conn: AsyncConn, gpu_uuid: str, *, kind: RepairKind, by: str, note: str) -> Row | None:
    """Record a mark (the acknowledging login's connection); its row, None for a GPU the inventory lacks."""
    done = await dict_rows_async(
        conn,
        "SELECT * FROM mark_gpu_repaired(%(gpu)s, %(kind)s, %(by)s, %(note)s)",
        {"gpu": gpu_uuid, "kind": kind, "by": by, "note": note},
    )
    return done[0] if done else None


def mark_at(conn: SyncConn, gpu_uuid: str, *, kind: RepairKind, by: str, note: str, at: datetime) -> None:
    """A mark as of `at` (a simulation's person, on its clock; the API marks as of now), in the caller's
    transaction."""
    conn.execute(
        "INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by, note) VALUES (%s, %s, %s, %s, %s)",
        (gpu_uuid, at, kind, by, note),
    )


async def listed(conn: AsyncConn, gpu_uuid: str, *, limit: int) -> list[Row]:
    """A GPU's marks, newest first."""
    return await dict_rows_async(
        conn,
        "SELECT id, gpu_uuid, time, kind, marked_by, note FROM gpu_repairs WHERE gpu_uuid = %(gpu)s"
        " ORDER BY time DESC, id DESC LIMIT %(limit)s",
        {"gpu": gpu_uuid, "limit": limit},
    )

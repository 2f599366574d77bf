"""Remedies carried out on GPUs (gpu_remedies, schema/0080): a GPU reset or a node reboot that was done.

Written by the remediator when its reset_gpu or reboot step completes (live only, in the step's
transaction), by the API for an operator's reset by hand, and by the database itself when a GPU's
NVML recovery action goes back to none (the trigger in schema/0080). The scorer reads them in
shared.store.verdict_inputs: what a remedy resolves is not counted from before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import psycopg

from .errors import translated
from .results import Row, dict_rows_async

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
Remedy = Literal["reset_gpu", "reboot_node"]


def record(
    conn: SyncConn, gpu_uuids: Sequence[str], *, at: datetime, remedy: Remedy, plan_id: int, note: str
) -> None:
    """The remediator's remedy on each GPU, by plan `plan_id` (once per plan and GPU), in the caller's
    transaction."""
    with translated(conn):
        conn.execute(
            "INSERT INTO gpu_remedies (gpu_uuid, at, remedy, source, plan_id, actor, note)"
            " SELECT g, %s, %s, 'remediator', %s, 'remediator', %s FROM unnest(%s::text[]) AS g"
            " ON CONFLICT (plan_id, gpu_uuid) WHERE plan_id IS NOT NULL DO NOTHING",
            (at, remedy, plan_id, note, list(gpu_uuids)),
        )


async def mark(conn: AsyncConn, gpu_uuid: str, *, remedy: Remedy, by: str, note: str) -> Row | None:
    """An operator's reset or reboot by hand (the acknowledging login's connection); its row, None for a
    GPU the inventory lacks."""
    done = await dict_rows_async(
        conn,
        "SELECT * FROM record_gpu_remedy(%(gpu)s, %(remedy)s, %(by)s, %(note)s)",
        {"gpu": gpu_uuid, "remedy": remedy, "by": by, "note": note},
    )
    return done[0] if done else None


async def listed(conn: AsyncConn, gpu_uuid: str, *, limit: int) -> list[Row]:
    """A GPU's remedies, newest first."""
    return await dict_rows_async(
        conn,
        "SELECT id, gpu_uuid, at, remedy, source, plan_id, actor, note FROM gpu_remedies"
        " WHERE gpu_uuid = %(gpu)s ORDER BY at DESC, id DESC LIMIT %(limit)s",
        {"gpu": gpu_uuid, "limit": limit},
    )


def forget_the_remediators(conn: SyncConn) -> None:
    """Delete the remediator's own remedies (the evaluation's 'loop open' arm: a remedy resolves nothing)."""
    with translated(conn):
        conn.execute("DELETE FROM gpu_remedies WHERE source = 'remediator'")

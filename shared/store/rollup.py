"""gpu_metrics_1min (apache license): the minutes a batch stored samples in, and their refresh.

A batch notes its minutes in gpu_metrics_1min_pending, in its own transaction
(`note_minutes`); the refresh (`refresh`, schema/0014's
gpu_metrics_1min_refresh) takes the committed notes and recomputes those
minutes from gpu_metrics, on a connection of its own, after the batches.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .errors import translated

_NOTE = (
    "INSERT INTO gpu_metrics_1min_pending (bucket)"
    " SELECT DISTINCT time_bucket(interval '1 minute', t) FROM unnest(%s::timestamptz[]) AS t"
)


def note_minutes(cur: psycopg.Cursor[Any], times: Collection[datetime]) -> None:
    """Note the minutes of these sample times for the refresh (in the caller's transaction)."""
    if times:
        with translated(cur.connection):
            cur.execute(_NOTE, (list(times),))


def refresh(conn: psycopg.Connection[Any], keep_raw: timedelta) -> int:
    """Recompute every noted minute newer than `keep_raw` and commit; how many minutes it recomputed."""
    with translated(conn):
        row = conn.execute("SELECT gpu_metrics_1min_refresh(%s)", (keep_raw,)).fetchone()
        conn.commit()
    return int(str(row[0])) if row else 0


def behind(conn: psycopg.Connection[Any]) -> bool:
    """Minutes noted by stored batches that no refresh has recomputed yet."""
    with translated(conn):
        row = conn.execute("SELECT EXISTS (SELECT FROM gpu_metrics_1min_pending)").fetchone()
    return bool(row and row[0])

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
from .offsets import IN_PARTITIONS, Partition, partition_arrays

_NOTE = (
    "INSERT INTO gpu_metrics_1min_pending (bucket)"
    " SELECT DISTINCT public.time_bucket(interval '1 minute', t) FROM unnest(%s::timestamptz[]) AS t"
)


def note_minutes(cur: psycopg.Cursor[Any], times: Collection[datetime]) -> None:
    """Note the minutes of these sample times for the refresh (in the caller's transaction)."""
    if times:
        with translated(cur.connection):
            cur.execute(_NOTE, (list(times),))


# The slowest busy partition's frontier (schema/0018): partitions whose frontier has not moved
# for BUSY, and those whose sink has caught up (0019), do not hold back.
BUSY = timedelta(minutes=1)
_FRONTIER = (
    "SELECT min(frontier) FROM kafka_offsets WHERE consumer_group = %s AND topic = %s"
    " AND frontier IS NOT NULL AND NOT caught_up AND frontier_at > now() - %s::interval"
    " AND NOT " + IN_PARTITIONS
)
_OLDEST_NOTE = "SELECT extract(epoch FROM clock_timestamp() - min(noted_at)) FROM gpu_metrics_1min_pending"


def refresh(
    conn: psycopg.Connection[Any],
    keep_raw: timedelta,
    complete_for: tuple[str, str] | None = None,
    caught_up: Collection[Partition] = (),
) -> int:
    """Recompute the noted minutes newer than `keep_raw` and commit; how many minutes it recomputed.

    Every noted minute; or, with `complete_for` (a consumer group and its samples' topic), only
    those before the minute of the slowest partition's frontier among the partitions it stored
    samples of in the last BUSY and has not caught up with (the minutes every partition has passed; all
    of them if there are none such); the others stay noted. `caught_up`: partitions the caller
    has stored everything of, which never hold back.
    """
    with translated(conn):
        if complete_for is None:
            row = conn.execute("SELECT gpu_metrics_1min_refresh(%s)", (keep_raw,)).fetchone()
        else:
            group, topic = complete_for
            row = conn.execute(
                f"SELECT gpu_metrics_1min_refresh(%s, ({_FRONTIER}))",
                (keep_raw, group, topic, BUSY, *partition_arrays(caught_up)),
            ).fetchone()
        conn.commit()
    return int(str(row[0])) if row else 0


def oldest_note_age(conn: psycopg.Connection[Any]) -> float | None:
    """Seconds since the oldest minute still noted was noted; None if none is."""
    with translated(conn):
        row = conn.execute(_OLDEST_NOTE).fetchone()
        conn.commit()
    return float(row[0]) if row and row[0] is not None else None


def behind(conn: psycopg.Connection[Any]) -> bool:
    """Minutes noted by stored batches that no refresh has recomputed yet."""
    with translated(conn):
        row = conn.execute("SELECT EXISTS (SELECT FROM gpu_metrics_1min_pending)").fetchone()
    return bool(row and row[0])

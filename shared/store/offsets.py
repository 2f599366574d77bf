"""kafka_offsets: the next offset each consumer group stored per partition, moved with its batch.

The database, not Kafka, holds a sink's position: a batch's offsets are stored
in the batch's transaction (`store`, never moving backwards), and a partition
assigned to a sink resumes from `stored` (absent: never written, start at the
beginning). `stored_sum` is how much of its topics a group has done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import psycopg

from .errors import translated

Partition = tuple[str, int]  # (topic, partition)

# "(topic, partition) is one of these": bound to the two arrays of `partition_arrays`
IN_PARTITIONS = "(topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))"

_UPSERT = (
    "INSERT INTO kafka_offsets (consumer_group, topic, partition, next_offset, frontier, frontier_at)"
    " VALUES (%(group)s, %(topic)s, %(partition)s, %(offset)s, %(frontier)s,"
    " CASE WHEN %(frontier)s::timestamptz IS NOT NULL THEN now() END)"
    " ON CONFLICT (consumer_group, topic, partition) DO UPDATE"
    " SET next_offset = greatest(kafka_offsets.next_offset, EXCLUDED.next_offset), updated_at = now(),"
    " frontier = greatest(kafka_offsets.frontier, EXCLUDED.frontier),"
    " frontier_at = coalesce(EXCLUDED.frontier_at, kafka_offsets.frontier_at), caught_up = false"
)
_CAUGHT_UP = "UPDATE kafka_offsets SET caught_up = true WHERE consumer_group = %s AND " + IN_PARTITIONS
_SELECT = "SELECT topic, partition, next_offset FROM kafka_offsets WHERE consumer_group = %s"
_SELECT_SOME = _SELECT + " AND " + IN_PARTITIONS
_SUM = "SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets WHERE consumer_group = %s"


def partition_arrays(partitions: Iterable[Partition]) -> tuple[list[str], list[int]]:
    """The partitions as IN_PARTITIONS' two parameters: their topics, their numbers."""
    wanted = sorted(partitions)
    return [t for t, _ in wanted], [p for _, p in wanted]


def store(
    cur: psycopg.Cursor[Any],
    group: str,
    next_offsets: Mapping[Partition, int],
    frontiers: Mapping[Partition, datetime] | None = None,
) -> None:
    """Record the next offsets of `group` (in the caller's transaction); a smaller one changes nothing.

    `frontiers`: per partition, the time of the newest sample stored with them (never moving
    back either), which tells the rollup's refresh how far every partition has come.
    """
    if next_offsets:
        times = frontiers or {}
        rows = [
            {"group": group, "topic": t, "partition": p, "offset": o, "frontier": times.get((t, p))}
            for (t, p), o in sorted(next_offsets.items())
        ]
        with translated(cur.connection):
            cur.executemany(_UPSERT, rows)


def mark_caught_up(conn: psycopg.Connection[Any], group: str, partitions: Iterable[Partition]) -> None:
    """`group` has stored everything there was of these partitions (until its next batch of them)."""
    topics, numbers = partition_arrays(partitions)
    if topics:
        with translated(conn):
            conn.execute(_CAUGHT_UP, (group, topics, numbers))
            conn.commit()


def stored(
    conn: psycopg.Connection[Any], group: str, partitions: Iterable[Partition] | None = None
) -> dict[Partition, int]:
    """The next offsets `group` stored (for `partitions` only, if given), and the read committed."""
    with translated(conn):
        if partitions is None:
            rows = conn.execute(_SELECT, (group,)).fetchall()
        else:
            rows = conn.execute(_SELECT_SOME, (group, *partition_arrays(partitions))).fetchall()
        conn.commit()
    return {(str(t), int(str(p))): int(str(o)) for t, p, o in rows}


def stored_sum(conn: psycopg.Connection[Any], group: str) -> int:
    """The next offsets `group` stored, summed over its partitions: the messages it has done."""
    with translated(conn):
        row = conn.execute(_SUM, (group,)).fetchone()
    return int(str(row[0])) if row else 0

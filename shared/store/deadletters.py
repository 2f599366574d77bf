"""sink_dead_letters: dead letters recorded with their batch, leased, marked delivered.

A letter is recorded in its batch's transaction (`record`, a re-read record
adding nothing: the key is group, topic, partition, offset); a relay leases
the pending ones (`lease`: several relays of one group never take the same
letter), produces them, then marks them delivered (`mark_delivered`) or gives
the lease back (`unlease`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg

from .errors import printable, translated

Source = tuple[str, int, int]  # (topic, partition, offset) of a consumed record


class Letter(Protocol):
    """What is recorded of a dead letter (services.sink.deadletters.DeadLetter has it)."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    category: str
    reason: str


@dataclass(frozen=True, slots=True)
class LeasedLetter:
    """A recorded, undelivered dead letter, leased to this relay for a while."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    category: str
    reason: str
    failed_at: datetime
    attempts: int  # 1: never tried before this lease


_RECORD = (
    "INSERT INTO sink_dead_letters (consumer_group, source_topic, source_partition, source_offset,"
    " key, value, category, reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING"
)
_LEASE = """
UPDATE sink_dead_letters d SET attempts = d.attempts + 1, leased_until = now() + make_interval(secs => %s),
    leased_by = pg_backend_pid()
FROM (SELECT consumer_group, source_topic, source_partition, source_offset FROM sink_dead_letters l
      WHERE consumer_group = %s AND delivered_at IS NULL
        AND (leased_until IS NULL OR leased_until < now()
             OR NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = l.leased_by))
      ORDER BY failed_at LIMIT %s FOR UPDATE SKIP LOCKED) p
WHERE (d.consumer_group, d.source_topic, d.source_partition, d.source_offset)
    = (p.consumer_group, p.source_topic, p.source_partition, p.source_offset)
RETURNING d.source_topic, d.source_partition, d.source_offset, d.key, d.value, d.category, d.reason,
          d.failed_at, d.attempts
"""
_MARK = """
UPDATE sink_dead_letters SET delivered_at = now(), leased_until = NULL, leased_by = NULL
WHERE consumer_group = %s AND (source_topic, source_partition, source_offset)
    IN (SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))
"""
_UNLEASE = """
UPDATE sink_dead_letters SET leased_until = NULL, leased_by = NULL
WHERE consumer_group = %s AND (source_topic, source_partition, source_offset)
    IN (SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))
"""


def record(cur: psycopg.Cursor[Any], group: str, letters: Iterable[Letter]) -> int:
    """Record the letters in the caller's transaction (a re-recorded one adds nothing); how many given."""
    params = [
        (group, d.topic, d.partition, d.offset, d.key, d.value, d.category, printable(d.reason))
        for d in letters
    ]
    if params:
        with translated(cur.connection):
            cur.executemany(_RECORD, params)
    return len(params)


def lease(conn: psycopg.Connection[Any], group: str, *, lease_s: float, limit: int) -> list[LeasedLetter]:
    """Lease up to `limit` undelivered letters of `group` for `lease_s` (committed), oldest first."""
    with translated(conn), conn.transaction():
        rows = conn.execute(_LEASE, (lease_s, group, limit)).fetchall()
    return [
        LeasedLetter(
            topic=str(t),
            partition=int(str(p)),
            offset=int(str(o)),
            key=_bytes(k),
            value=_bytes(v),
            category=str(c),
            reason=str(r),
            failed_at=at if isinstance(at, datetime) else datetime.now(UTC),
            attempts=int(str(n)),
        )
        for t, p, o, k, v, c, r, at, n in rows
    ]


def mark_delivered(conn: psycopg.Connection[Any], group: str, sources: Iterable[Source]) -> None:
    """The letters reached the dead-letter topic: never lease them again (committed)."""
    _update(conn, _MARK, group, sources)


def unlease(conn: psycopg.Connection[Any], group: str, sources: Iterable[Source]) -> None:
    """Give the leases back, so the next relay round tries the letters again (committed)."""
    _update(conn, _UNLEASE, group, sources)


def _update(conn: psycopg.Connection[Any], statement: str, group: str, sources: Iterable[Source]) -> None:
    ordered = sorted(sources)
    if ordered:
        keys = (group, [s[0] for s in ordered], [s[1] for s in ordered], [s[2] for s in ordered])
        with translated(conn), conn.transaction():
            conn.execute(statement, keys)


def _bytes(value: object) -> bytes | None:
    return bytes(value) if isinstance(value, bytes | memoryview | bytearray) else None

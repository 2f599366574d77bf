"""Retention and maintenance statements: the retention lock, drop_chunks, policies, a chunk's SHARE lock.

The sink's retention loop (services/sink/retention.py) decides what to drop
and when; these functions say it to the server. They take a sync connection;
driver failures leave as `shared.plumbing.errors.DatabaseError` (or a subclass).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import psycopg
from psycopg import sql

from .archive import Chunk, Conn
from .errors import translate, translated

_LOCK_CLASS = 0x67707573  # arbitrary, fixed: "retention", with the schema's hash as the second key


def try_retention_lock(conn: Conn) -> bool:
    """Take the session-level retention lock of the connection's schema, if no other session holds it."""
    with translated(conn):
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(current_schema()))", (_LOCK_CLASS,)
        ).fetchone()
    return bool(row and row[0])


def release_retention_lock(conn: Conn) -> None:
    """Release the lock try_retention_lock took."""
    with translated(conn):
        conn.execute("SELECT pg_advisory_unlock(%s, hashtext(current_schema()))", (_LOCK_CLASS,))


def forget_delivered_dead_letters(conn: Conn, older_than_days: int) -> int:
    """Delete dead letters delivered more than `older_than_days` ago; how many went."""
    with translated(conn):
        return conn.execute(
            "DELETE FROM sink_dead_letters WHERE delivered_at < now() - make_interval(days => %s)",
            (older_than_days,),
        ).rowcount


def remove_retention_policy(conn: Conn, table: str) -> None:
    """Remove `table`'s retention policy, if it has one (timescale license only; schema/0086's function,
    so that the sink need not own the table)."""
    with translated(conn):
        conn.execute("SELECT sink_remove_retention_policy(%s::regclass)", (table,))


def drop_chunks_older_than(conn: Conn, table: str, cutoff: datetime) -> int:
    """drop_chunks(table, older_than => cutoff) through schema/0086's function; how many chunks it dropped."""
    with translated(conn):
        row = conn.execute("SELECT sink_drop_chunks(%s::regclass, %s)", (table, cutoff)).fetchone()
    return int(row[0]) if row else 0


def range_holds_only(conn: Conn, chunk: Chunk) -> bool:
    """Whether dropping by `chunk`'s range would drop exactly this chunk and no other."""
    with translated(conn):
        row = conn.execute(
            "SELECT coalesce(array_agg(s.c::oid), '{}') = ARRAY[%s::regclass::oid]"
            " FROM public.show_chunks(%s::regclass, older_than => %s, newer_than => %s) AS s(c)",
            (chunk.relation(conn), chunk.hypertable, chunk.end, chunk.start),
        ).fetchone()
    return bool(row and row[0])


def drop_chunk_range(conn: Conn, chunk: Chunk) -> int:
    """drop_chunks over exactly `chunk`'s range; how many chunks it dropped (check range_holds_only first)."""
    with translated(conn):
        row = conn.execute(
            "SELECT sink_drop_chunks(%s::regclass, %s, %s)", (chunk.hypertable, chunk.end, chunk.start)
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def share_locked(conn: Conn, chunk: Chunk) -> Iterator[None]:
    """A transaction holding a SHARE lock on `chunk`, committed when the block ends without an error.

    Late rows for the chunk's time range wait for the commit instead of slipping
    in between the archive's copy and the drop.
    """
    try:
        with conn.transaction():
            with translated(conn):
                conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(chunk.ident))
            yield
    except psycopg.Error as e:  # a driver error (the commit's, the rollback's); anything else leaves as it is
        raise translate(e, conn) from e


def last_rollup_refresh(conn: Conn) -> datetime | None:
    """When the continuous aggregate's refresh job last succeeded (timescale license), if ever."""
    with translated(conn):
        row = conn.execute(
            "SELECT max(s.last_successful_finish) FROM timescaledb_information.job_stats s"
            " JOIN timescaledb_information.jobs j USING (job_id)"
            " WHERE j.proc_name = 'policy_refresh_continuous_aggregate'"
        ).fetchone()
    return row[0] if row is not None else None


def vacuum_analyze(conn: Conn, table: str) -> None:
    """VACUUM ANALYZE `table` (needs an autocommit connection)."""
    with translated(conn):
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))

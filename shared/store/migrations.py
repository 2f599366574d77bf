"""The migration runner's bookkeeping: its lock, the `schema_migrations` table, applying one file.

The migrations themselves are SQL files in `schema/`; `shared.plumbing.migrate` finds
and orders them and decides what to apply. These functions take a sync
connection with autocommit off and commit what they say they commit; driver
failures leave as `shared.plumbing.errors.DatabaseError` (or a subclass).
"""

from __future__ import annotations

import psycopg

from .errors import translated
from .server import Conn

# Arbitrary but fixed: every runner of this project takes the same lock.
_LOCK_ID = 0x6770_7568_6561_6C74 & 0x7FFF_FFFF_FFFF_FFFF

_VERSIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


def lock_runners(conn: Conn) -> None:
    """Wait for, then hold, the session lock every migration runner takes (concurrent starts queue)."""
    with translated(conn):
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))


def unlock_runners(conn: Conn) -> None:
    """Release the runners' lock and commit."""
    with translated(conn):
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
        conn.commit()


def recorded_checksums(conn: Conn) -> dict[int, str]:
    """Version -> checksum of every migration applied so far (the table is created if missing, committed)."""
    with translated(conn):
        conn.execute(_VERSIONS_TABLE)
        conn.commit()
        rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
    return {int(str(version)): str(checksum) for version, checksum in rows}


def apply_migration(conn: Conn, *, version: int, name: str, checksum: str, statements: str) -> None:
    """Run one migration file's `statements` and record it, in one transaction; rolled back on failure."""
    with translated(conn):
        try:
            conn.execute(statements.encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (version, name, checksum),
            )
            conn.commit()
        except psycopg.Error:
            conn.rollback()
            raise


def applied_versions(conn: Conn) -> set[int] | None:
    """The versions recorded in this schema's `schema_migrations`; None when it has no such table.
    Reads only (a service's start check)."""
    with translated(conn):
        row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        if not (row and row[0]):
            return None
        return {int(str(v)) for (v,) in conn.execute("SELECT version FROM schema_migrations").fetchall()}

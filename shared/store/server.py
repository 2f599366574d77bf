"""Facts about the server and the session: TimescaleDB's version and license, the search_path, schemas.

Every function takes a sync psycopg connection; driver failures leave as
`shared.errors.DatabaseError` (or a subclass) through `errors.translated`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from shared.errors import DatabaseError

from .errors import translated

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class TimescaleInfo:
    """What the server's TimescaleDB can do.

    The Debian/Apache build reports license `apache`: hypertables, time_bucket
    and drop_chunks work, but compression, continuous aggregates and jobs do
    not. The `timescale` license (the official image) has everything.
    """

    version: str
    license: str

    @property
    def full_features(self) -> bool:
        return self.license == "timescale"


def timescale_info(conn: Conn) -> TimescaleInfo:
    """The installed TimescaleDB version and license; DatabaseError when it is missing."""
    with translated(conn):
        row = conn.execute(
            "SELECT extversion, current_setting('timescaledb.license', true)"
            " FROM pg_extension WHERE extname = 'timescaledb'"
        ).fetchone()
    if row is None:
        raise DatabaseError("the timescaledb extension is not installed in this database")
    version, license_ = row
    return TimescaleInfo(version=str(version), license=str(license_ or "unknown"))


def set_search_path(conn: Conn, schema: str) -> None:
    """Resolve unqualified names in `schema` first, then public (where extensions live)."""
    with translated(conn):
        conn.execute(
            sql.SQL("SELECT set_config('search_path', {}, false)").format(
                sql.Literal(f"{sql.Identifier(schema).as_string(conn)}, public")
            )
        )
        if not conn.autocommit:
            conn.commit()


def create_schema(conn: Conn, name: str) -> None:
    """CREATE SCHEMA `name` (a throwaway one for a bench or an evaluation); commits when autocommit is off."""
    with translated(conn):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        if not conn.autocommit:
            conn.commit()


def drop_schema(conn: Conn, name: str) -> None:
    """DROP SCHEMA `name` CASCADE, with everything in it; commits when autocommit is off."""
    with translated(conn):
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
        if not conn.autocommit:
            conn.commit()

"""Facts about the server and the session: TimescaleDB's version and license, the search_path, schemas.

Every function takes a sync psycopg connection; driver failures leave as
`shared.plumbing.errors.DatabaseError` (or a subclass) through `errors.translated`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from shared.plumbing.errors import DatabaseError

from .errors import translated

Conn = psycopg.Connection[tuple[object, ...]]
_DEADLOCK = "40P01"  # SQLSTATE deadlock_detected

# Where TimescaleDB's functions live (the first migration creates the extension there, as the official
# image does): the project's SQL calls them as `public.time_bucket(...)`, so a service bound to its own
# schema needs no other schema on its search_path.
TIMESCALEDB_SCHEMA = "public"


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
            "SELECT extversion, current_setting('timescaledb.license', true),"
            " extnamespace::regnamespace::text"
            " FROM pg_extension WHERE extname = 'timescaledb'"
        ).fetchone()
    if row is None:
        raise DatabaseError("the timescaledb extension is not installed in this database")
    version, license_, schema = row
    if schema != TIMESCALEDB_SCHEMA:
        raise DatabaseError(
            f"the timescaledb extension is installed in schema {schema}; this project calls it in"
            f" {TIMESCALEDB_SCHEMA} (CREATE EXTENSION timescaledb WITH SCHEMA {TIMESCALEDB_SCHEMA})"
        )
    return TimescaleInfo(version=str(version), license=str(license_ or "unknown"))


def set_search_path(conn: Conn, schema: str, *, then_extensions: bool = False) -> None:
    """Resolve unqualified names in `schema` alone (pg_catalog aside): no table of another schema is
    reached, whatever exists there. `then_extensions` adds TimescaleDB's schema after it, for the
    migrations, whose applied files call its functions unqualified."""
    with translated(conn):
        path = sql.Identifier(schema).as_string(conn)
        if then_extensions:
            path += f", {sql.Identifier(TIMESCALEDB_SCHEMA).as_string(conn)}"
        conn.execute(sql.SQL("SELECT set_config('search_path', {}, false)").format(sql.Literal(path)))
        if not conn.autocommit:
            conn.commit()


def current_schema(conn: Conn) -> str:
    """The schema unqualified names resolve in; DatabaseError when the search_path names none that exists."""
    with translated(conn):
        row = conn.execute("SELECT current_schema()").fetchone()
    if row is None or row[0] is None:
        path = conn.execute("SHOW search_path").fetchone()
        raise DatabaseError(f"no schema of the search_path ({path[0] if path else '?'}) exists")
    return str(row[0])


def create_schema(conn: Conn, name: str) -> None:
    """CREATE SCHEMA `name` (a throwaway one for a bench or an evaluation); commits when autocommit is off."""
    with translated(conn):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        if not conn.autocommit:
            conn.commit()


def drop_schema(conn: Conn, name: str, *, attempts: int = 3) -> None:
    """DROP SCHEMA `name` CASCADE, with everything in it; commits when autocommit is off.

    Tried again when PostgreSQL ends it as a deadlock (with autovacuum, say, which takes a
    fresh table's locks in another order than the drop)."""
    for attempt in range(1, attempts + 1):
        try:
            with translated(conn):
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
                if not conn.autocommit:
                    conn.commit()
            return
        except DatabaseError as e:
            if attempt == attempts or getattr(e.__cause__, "sqlstate", None) != _DEADLOCK:
                raise
            if not conn.autocommit:
                conn.rollback()

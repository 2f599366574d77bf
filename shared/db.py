"""Database access: connecting with bounded retries, and TimescaleDB's version and license."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from shared.config import DatabaseSettings
from shared.errors import DatabaseError, DatabaseUnavailableError

log = logging.getLogger(__name__)


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


def connect(
    settings: DatabaseSettings,
    *,
    autocommit: bool = False,
    schema: str | None = None,
) -> psycopg.Connection[tuple[object, ...]]:
    """Open one connection; `schema` puts that schema first on the search_path."""
    try:
        conn = psycopg.connect(settings.conninfo(), autocommit=autocommit)
    except psycopg.OperationalError as e:
        where = f"{settings.user}@{settings.host}:{settings.port}/{settings.name}"
        raise DatabaseUnavailableError(f"cannot connect to {where}: {e}") from e
    if schema:
        set_search_path(conn, schema)
    return conn


def set_search_path(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Resolve unqualified names in `schema` first, then public (where extensions live)."""
    conn.execute(
        sql.SQL("SELECT set_config('search_path', {}, false)").format(
            sql.Literal(f"{sql.Identifier(schema).as_string(conn)}, public")
        )
    )
    if not conn.autocommit:
        conn.commit()


def wait_for_database(
    settings: DatabaseSettings, timeout_s: float = 60.0
) -> psycopg.Connection[tuple[object, ...]]:
    """Connect, retrying with backoff until `timeout_s`; the last error is in the exception."""
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            return connect(settings)
        except DatabaseUnavailableError as e:
            if time.monotonic() + delay > deadline:
                raise DatabaseUnavailableError(f"database not reachable in {timeout_s:g} s: {e}") from e
            log.info("database not ready, retrying in %.1f s", delay, extra={"error": str(e)})
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def timescale_info(conn: psycopg.Connection[tuple[object, ...]]) -> TimescaleInfo:
    """The installed TimescaleDB version and license; DatabaseError when it is missing."""
    row = conn.execute(
        "SELECT extversion, current_setting('timescaledb.license', true)"
        " FROM pg_extension WHERE extname = 'timescaledb'"
    ).fetchone()
    if row is None:
        raise DatabaseError("the timescaledb extension is not installed in this database")
    version, license_ = row
    return TimescaleInfo(version=str(version), license=str(license_ or "unknown"))

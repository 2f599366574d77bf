"""Database connections: connecting with bounded retries (the statements live in `shared.store`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import overload

import psycopg

from shared.config import DatabaseSettings
from shared.errors import DatabaseUnavailableError
from shared.store.server import set_search_path

log = logging.getLogger(__name__)


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


@overload
def wait_for_database(
    settings: DatabaseSettings, timeout_s: float = 60.0, *, stop: None = None
) -> psycopg.Connection[tuple[object, ...]]: ...
@overload
def wait_for_database(
    settings: DatabaseSettings, timeout_s: float = 60.0, *, stop: threading.Event
) -> psycopg.Connection[tuple[object, ...]] | None: ...
def wait_for_database(
    settings: DatabaseSettings, timeout_s: float = 60.0, *, stop: threading.Event | None = None
) -> psycopg.Connection[tuple[object, ...]] | None:
    """Connect, retrying with backoff until `timeout_s`; the last error is in the exception.

    None if `stop` is set while waiting (a service told to stop before it could start).
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            return connect(settings)
        except DatabaseUnavailableError as e:
            if time.monotonic() + delay > deadline:
                raise DatabaseUnavailableError(f"database not reachable in {timeout_s:g} s: {e}") from e
            log.info("database not ready, retrying in %.1f s", delay, extra={"error": str(e)})
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                return None
            delay = min(delay * 2, 5.0)

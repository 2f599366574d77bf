"""Database connections: connecting with bounded retries (the statements live in `shared.store`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


@contextmanager
def statements_cancelled_on(
    stop: threading.Event,
    connections: Callable[[], Iterable[psycopg.Connection[tuple[object, ...]]]],
    *,
    grace_s: float = 5.0,
    every_s: float = 1.0,
) -> Iterator[None]:
    """For the block: once `stop` is set and `grace_s` has passed, cancel the statement each of
    `connections()` is running, again every `every_s` until the block ends.

    A service told to stop finishes what it is doing; one stuck in a statement (a lock held by
    another session, a server that stopped answering) would not, and an orchestrator would kill it.
    The statement fails (QueryCanceled, a DatabaseError to the caller), its transaction rolls back,
    and the caller, seeing `stop`, gives the work up: nothing half-done is committed.
    """
    done = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            if done.is_set():
                return
        if done.wait(grace_s):
            return
        while not done.is_set():
            for conn in list(connections()):
                if conn.closed:
                    continue
                try:
                    conn.cancel_safe(timeout=every_s)
                except (psycopg.Error, OSError) as e:  # the server is away: the statement fails anyway
                    log.debug("cancelling a statement at stop failed: %s", e)
            done.wait(every_s)

    watcher = threading.Thread(target=watch, name="cancel-at-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=every_s + 1)

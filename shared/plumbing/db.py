"""Database connections: connecting with bounded retries (the statements live in `shared.store`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import overload

import psycopg
from psycopg import pq

from shared.plumbing.errors import DatabaseUnavailableError
from shared.settings.common import DatabaseSettings
from shared.store.server import set_search_path

log = logging.getLogger(__name__)


# Every connection `connect` opened in this process, while it is open: what a stopping service
# cancels and cuts (statements_cancelled_on), whichever loop, thread or helper holds it.
_OPEN: weakref.WeakSet[psycopg.Connection[tuple[object, ...]]] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()
# Set while a stopping process refuses new connections: (the monotonic time from which every
# attempt is refused, why). An attempt before then may take only the time left until it.
_refuse_from: tuple[float, str] | None = None


def open_connections() -> list[psycopg.Connection[tuple[object, ...]]]:
    """The connections `connect` opened in this process that are still open."""
    with _OPEN_LOCK:
        return [conn for conn in list(_OPEN) if not conn.closed]


def _connect_timeout(settings: DatabaseSettings) -> int:
    """The connect timeout an attempt may take now; DatabaseUnavailableError once attempts are refused."""
    refuse = _refuse_from
    if refuse is None:
        return settings.connect_timeout_s
    left = refuse[0] - time.monotonic()
    if left < 1:
        raise DatabaseUnavailableError(f"no new connection: {refuse[1]}")
    return min(settings.connect_timeout_s, int(left))


def connect(
    settings: DatabaseSettings,
    *,
    autocommit: bool = False,
    schema: str | None = None,
) -> psycopg.Connection[tuple[object, ...]]:
    """Open one connection; `schema` puts that schema first on the search_path.

    While a service stops, an attempt takes at most the time left before its connections are cut,
    and after that none is made (DatabaseUnavailableError): see statements_cancelled_on.
    """
    timeout = _connect_timeout(settings)
    try:
        conn = psycopg.connect(settings.conninfo(connect_timeout=timeout), autocommit=autocommit)
    except psycopg.OperationalError as e:
        where = f"{settings.user}@{settings.host}:{settings.port}/{settings.name}"
        raise DatabaseUnavailableError(f"cannot connect to {where}: {e}") from e
    with _OPEN_LOCK:
        _OPEN.add(conn)
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


@dataclass(frozen=True, slots=True)
class StopPhases:
    """When, after `stop`, a stopping service's statements are cancelled and its connections cut."""

    grace_s: float = 5.0
    """Statements run undisturbed this long: the work in hand is finished."""
    cut_s: float = 10.0
    """From then on a connection still busy is cut and none is opened (the server does not answer)."""

    @classmethod
    def within(cls, timeout_s: float) -> StopPhases:
        """The phases of a shutdown that must end within `timeout_s` (ShutdownSettings.timeout_s): the
        first quarter to finish, the second to cancel, the rest for what the cut unblocks to wind down."""
        return cls(grace_s=timeout_s / 4, cut_s=timeout_s / 2)


def _busy(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether the connection is running a statement now (waiting on a lock, or on the server)."""
    try:
        return not conn.closed and conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE
    except psycopg.Error:
        return False


def cut(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Shut the socket of a connection waiting on a server that does not answer: the statement fails at
    once (OperationalError, the connection broken); the server rolls its transaction back when it notices.

    The owner's thread is blocked in that statement, so it cannot close the socket meanwhile.
    """
    fd = conn.pgconn.socket
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def statements_cancelled_on(
    stop: threading.Event,
    connections: Callable[[], Iterable[psycopg.Connection[tuple[object, ...]]]] = open_connections,
    *,
    phases: StopPhases | None = None,
    every_s: float = 0.5,
    refuse_new: bool = False,
) -> Iterator[None]:
    """For the block: once `stop` is set, bound what the database can hold up, in two phases.

    A service told to stop finishes what it is doing; one stuck in a statement would not, and an
    orchestrator would kill it. Once `phases.grace_s` has passed, the statement each of
    `connections()` (by default every connection of the process) is running is cancelled, again every
    `every_s` until the block ends: one waiting on a lock held by another session fails (QueryCanceled,
    a DatabaseError to the caller), its transaction rolls back, and the caller, seeing `stop`, gives
    the work up: nothing half-done is committed. A server (or network) that stopped answering gets
    no cancel request either: from `phases.cut_s` on, a connection still busy is cut (`cut`), and with
    `refuse_new` (a whole process stopping) no new connection is opened, and one opened before then
    may take only the time left until it.
    """
    global _refuse_from
    phases = phases or StopPhases()
    done = threading.Event()

    def watch() -> None:
        global _refuse_from
        while not stop.wait(0.2):
            if done.is_set():
                return
        stopped = time.monotonic()
        if refuse_new:
            _refuse_from = (stopped + phases.cut_s, "the service is stopping")
        if done.wait(phases.grace_s):
            return
        while not done.is_set():
            for conn in list(connections()):
                if not _busy(conn):
                    continue
                # a deaf server makes each cancel wait out its timeout: the cut point is not put off
                left = stopped + phases.cut_s - time.monotonic()
                try:
                    if left <= 0:
                        log.warning("a statement still waits on the server at stop: cutting its connection")
                        cut(conn)
                    else:
                        conn.cancel_safe(timeout=max(0.1, min(every_s, left)))
                except (psycopg.Error, OSError, ValueError) as e:  # the server is away: the cut comes next
                    log.debug("cancelling a statement at stop failed: %s", e)
            done.wait(every_s)

    watcher = threading.Thread(target=watch, name="cancel-at-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=every_s + 1)
        if refuse_new:
            _refuse_from = None

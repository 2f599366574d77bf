"""How every long-running service runs, start to stop: signals set `stop`, what it holds closes in reverse.

    def main() -> int:                                          # services/<name>/__main__.py
        return run_service(NameSettings, "name", NameService, log=log)

run_service is the one skeleton: the settings (start_service: invalid, exit 2),
the service's object graph built from them (services/<name>/build.py; a
GpuHealthError there, a policy or rules file, exit 2), then

    with ServiceRun("name") as life:                           # SIGTERM/SIGINT -> life.stop
        loop = service.start(life)     # /metrics, ports, each resource entered: cannot, exit 1
        loop.run(life.stop)
    return service.stopped()           # the exit status, once everything is closed

Leaving the block, by return, by the loop's end or by an exception, sets
`stop` first (so threads the service started wind down) and then closes every
entered resource once, the last entered first: threads are joined before the
producer they publish through is flushed, and the metrics server, entered
first, goes last, so an OTLP receiver gets the counts of the final flush. The
signal handlers that were there before are put back.

From `stop` to the end of the block takes at most the one shutdown deadline
(ShutdownSettings.timeout_s, `GPUHEALTH_SHUTDOWN__TIMEOUT_S`), whatever the
database does: its first quarter finishes the work in hand; then every
statement of the process still running is cancelled (a lock held by another
session), and from half of it a connection still waiting on the server is cut
and no new one is opened (a server or network that stopped answering:
shared.plumbing.db.statements_cancelled_on); threads are joined until nine tenths of it.
Should anything still hold the block at the deadline, every thread's stack is
logged and the process exits 1 there, before the orchestrator's SIGKILL.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType, TracebackType
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from shared.plumbing import otlp
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.service import serve_metrics, start_service
from shared.settings.common import DatabaseSettings, Settings, ShutdownSettings

log = logging.getLogger(__name__)

S = TypeVar("S", bound=Settings)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Loop(Protocol):
    """A service's work: runs until `stop` is set, finishing (and flushing) what it has in hand."""

    def run(self, stop: threading.Event) -> None: ...


class ServiceRun(ExitStack):
    """An ExitStack that owns a service's stop event, its signal handlers, its /metrics and its teardown."""

    def __init__(self, name: str, shutdown: ShutdownSettings | None = None) -> None:
        super().__init__()
        self.name = name
        self.stop = threading.Event()
        self.timeout_s = (shutdown or ShutdownSettings()).timeout_s
        self._stopped_at: float | None = None  # monotonic, once `stop` was seen set
        self._ended = threading.Event()

    def __enter__(self) -> ServiceRun:
        super().__enter__()
        threading.Thread(target=self._deadline, name="shutdown-deadline", daemon=True).start()
        self.callback(self._ended.set)
        # Signal handlers belong to the main thread; elsewhere (a test driving a service) the
        # caller sets `stop` itself.
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
            self.callback(_restore_handlers, previous)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._stopping()
        return bool(super().__exit__(exc_type, exc, tb))

    def _stopping(self) -> None:
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self.stop.set()

    def left_s(self) -> float:
        """Seconds left before the shutdown deadline (the whole deadline until `stop` is set)."""
        if self._stopped_at is None:
            return self.timeout_s
        return max(0.0, self._stopped_at + self.timeout_s - time.monotonic())

    def _deadline(self) -> None:
        """From `stop` the block has `timeout_s` to end; past it, the stacks are logged and the
        process exits 1."""
        while not self.stop.wait(0.2):
            if self._ended.is_set():
                return
        if self._stopped_at is None:  # set by a loop of the service, not by a signal or the block's end
            self._stopped_at = time.monotonic()
        if self._ended.wait(self.left_s()):
            return
        log.error(
            "%s did not stop within %g s of being told to; exiting now (the stacks follow)",
            self.name,
            self.timeout_s,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("%s: %s received, stopping", self.name, signal.Signals(signum).name)
        self._stopping()

    def serve_metrics(
        self, registry: CollectorRegistry, port: int, bind: str, *, database: DatabaseSettings | None = None
    ) -> None:
        """Serve /metrics (and export it over OTLP when that is on) until the end of the block; a
        service that needs the database waits for it first (at most two minutes), then checks that its
        schema holds every migration (MigrationError otherwise: a half-migrated schema is refused at
        start, not found table by table).

        OSError, naming the address, when the port is taken; DatabaseUnavailableError; MigrationError.
        """
        if database is not None:
            # here, not at the top: a service without a database (the collector) loads no psycopg
            from shared.plumbing.db import StopPhases, statements_cancelled_on, wait_for_database
            from shared.plumbing.migrate import check_migrated

            # Lasts until every resource entered after it is closed: past a quarter of the deadline
            # the process's statements are cancelled, past half its connections still waiting cut.
            phases = StopPhases.within(self.timeout_s)
            self.enter_context(statements_cancelled_on(self.stop, phases=phases, refuse_new=True))
            conn = wait_for_database(database, timeout_s=120, stop=self.stop)
            if conn is None:  # SIGTERM while waiting: the loops find `stop` set and return at once
                log.info("stopped before the database was reachable")
                return
            with conn:
                check_migrated(conn)
        self.callback(serve_metrics(registry, port, bind))

    def export_otlp(self, registry: CollectorRegistry) -> None:
        """Export `registry` over OTLP when that is on (a service that serves its metrics itself),
        flushed when the block ends."""
        otlp.export_registry(registry)
        self.callback(otlp.shutdown)

    def start_thread(self, loop: Loop, name: str) -> threading.Thread:
        """Run `loop.run(self.stop)` on a thread, joined (after `stop` is set) when the block ends, for
        at most what is left of the shutdown deadline."""
        thread = threading.Thread(target=loop.run, args=(self.stop,), name=name, daemon=True)
        thread.start()
        # the last tenth of the deadline is left for what is closed after it
        self.callback(lambda: _join(thread, max(0.0, self.left_s() - self.timeout_s / 10)))
        return thread


class Service(Protocol):
    """A service's object graph, built from its settings (services/<name>/build.py)."""

    def start(self, life: ServiceRun) -> Loop:
        """Open what it serves and holds, each entered into `life` (closed in reverse at the end);
        returns its loop. GpuHealthError or OSError (a port taken, the database): it cannot start."""
        ...

    def stopped(self) -> int:
        """Once everything it held is closed: its exit status, said in its log."""
        ...


def run_service(
    cls: type[S],
    name: str,
    build: Callable[[S], Service],
    *,
    log: logging.Logger,
    cannot_start: str | None = None,
) -> int:
    """Run the service `build` makes of its settings until SIGTERM/SIGINT or its loop's end.

    Returns the exit status: 2 for invalid settings (start_service) or a GpuHealthError from `build`
    (a policy, rules or weights file; logged as itself); 1 when the service cannot start (logged on
    `log` as "<cannot_start>: why", by default "<name> cannot start"); else what its `stopped()` says
    once every resource it held is closed.
    """
    settings = start_service(cls, name)
    if settings is None:
        return 2
    try:
        service = build(settings)
    except GpuHealthError as e:
        log.error("%s", e)
        return 2
    with ServiceRun(name, settings.shutdown) as life:
        try:
            loop = service.start(life)
        except (GpuHealthError, OSError) as e:
            log.error("%s: %s", cannot_start or f"{name} cannot start", e)
            return 1
        loop.run(life.stop)
    return service.stopped()


def stopped(log: logging.Logger) -> int:
    """A service's usual end: "stopped" in its log, exit status 0."""
    log.info("stopped")
    return 0


@contextmanager
def running(
    loop: Loop, *, name: str, stop: threading.Event | None = None, join_timeout_s: float = 60.0
) -> Iterator[threading.Event]:
    """`loop.run(stop)` on a thread for the block (a test's, an evaluation's); at its end `stop` is set
    and the thread joined. Yields the stop event (a fresh one unless given)."""
    stop = threading.Event() if stop is None else stop
    thread = threading.Thread(target=loop.run, args=(stop,), name=name, daemon=True)
    from shared.plumbing.db import (  # a loop without a database loads no psycopg
        StopPhases,
        statements_cancelled_on,
    )

    # its statements are cancelled, and its connections cut, as a stopping service's are
    phases = StopPhases.within(ShutdownSettings().timeout_s)
    with statements_cancelled_on(stop, phases=phases):
        thread.start()
        try:
            yield stop
        finally:
            stop.set()
            _join(thread, join_timeout_s)


class Server(Protocol):
    """A server that serves from its own threads between start() and stop()."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


def serve_until(server: Server, stop: threading.Event) -> None:
    """Start `server`, serve until `stop` is set, and stop it however that ends."""
    server.start()
    try:
        stop.wait()
    finally:
        server.stop()


def _restore_handlers(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _join(thread: threading.Thread, timeout_s: float) -> None:
    thread.join(timeout_s)
    if thread.is_alive():
        log.error("%s did not stop within %.0f s", thread.name, timeout_s)

"""Andon: the monitor and checker on a schedule, with hooks, an optional stop, publishing and metrics.

Training code calls `tick()` (the framework callbacks do it at each step end):
it reads the GPUs only when `every_s` seconds have passed on the monotonic
clock, so a step costs a clock read. `on_alert` hears of each alert when it
opens; an alert whose kind is in `stop_on` sets `stop_requested`, which each
framework's callback turns into its own stop. With `background=True` a thread
does the checks instead, so a job hung inside a step is still seen (idle
alert) and published, though only its next step can stop it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from .andon import Alert, AlertKind, AndonChecker, CheckResult
from .monitor import GpuMonitor, GpuStatus
from .sources import SourceError

log = logging.getLogger(__name__)
T = TypeVar("T")
AlertHook = Callable[[Alert], Any]


class AlertSink(Protocol):
    """Where opened and resolved alerts go besides the hooks (the Kafka publisher)."""

    def publish(self, alert: Alert, state: str) -> None: ...
    def close(self) -> None: ...


class MetricsSink(Protocol):
    """What the Prometheus exporter needs to hear after each check."""

    def observe(self, statuses: list[GpuStatus], result: CheckResult | None) -> None: ...
    def close(self) -> None: ...


class Andon:
    def __init__(
        self,
        *,
        monitor: GpuMonitor | None = None,
        checker: AndonChecker | None = None,
        every_s: float = 30.0,
        stop_on: Collection[AlertKind | str] = (),
        on_alert: AlertHook | None = None,
        on_resolved: AlertHook | None = None,
        publisher: AlertSink | None = None,
        exporter: MetricsSink | None = None,
        background: bool = False,
        clock: Callable[[], float] = time.monotonic,
        keep_alerts: int = 1000,
    ) -> None:
        if not every_s > 0:
            raise ValueError("every_s must be > 0")
        self.monitor = monitor if monitor is not None else GpuMonitor()
        self.checker = checker if checker is not None else AndonChecker()
        self.every_s = float(every_s)
        self.stop_on = frozenset(AlertKind(k) for k in stop_on)
        self.on_alert, self.on_resolved = on_alert, on_resolved
        self.publisher, self.exporter = publisher, exporter
        self.clock = clock
        self.alerts: deque[Alert] = deque(maxlen=keep_alerts)  # every alert that opened, oldest first
        self.checks = 0
        self.read_errors = 0
        self.stop_alert: Alert | None = None
        self._next_due: float | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._watch, name="gpuhealth-andon", daemon=True)
            self._thread.start()

    @property
    def stop_requested(self) -> bool:
        return self.stop_alert is not None

    def due(self) -> bool:
        return self._next_due is None or self.clock() >= self._next_due

    def tick(self) -> bool:
        """Call once per step: checks when due; True when training should stop."""
        if self._thread is None and self.due():
            self.check_now()
        return self.stop_requested

    def check_now(self) -> CheckResult | None:
        """Read the GPUs and check them now; None when the source could not be read."""
        with self._lock:
            now = self.clock()
            # a monotonic schedule: late checks do not drift it, and missed ones are not made up
            nxt = (self._next_due if self._next_due is not None else now) + self.every_s
            self._next_due = nxt if nxt > now else now + self.every_s
            self.checks += 1
            try:
                statuses = self.monitor.read()
            except SourceError as e:
                self.read_errors += 1
                log.warning("gpuhealth: GPU read failed: %s", e)
                self._export([], None)
                return None
            result = self.checker.check(statuses, now)
            self._export(statuses, result)
        for alert in result.opened:
            self.alerts.append(alert)
            log.warning("gpuhealth: %s", alert)
            if alert.kind in self.stop_on and self.stop_alert is None:
                self.stop_alert = alert
                log.error("gpuhealth: stopping training: %s", alert)
            self._deliver(alert, "open", self.on_alert)
        for alert in result.resolved:
            log.info("gpuhealth: resolved: %s", alert)
            self._deliver(alert, "resolved", self.on_resolved)
        return result

    def _export(self, statuses: list[GpuStatus], result: CheckResult | None) -> None:
        if self.exporter is not None:
            self.exporter.observe(statuses, result)

    def _deliver(self, alert: Alert, state: str, hook: AlertHook | None) -> None:
        # A broken hook or broker must not kill the training job it watches.
        if self.publisher is not None:
            try:
                self.publisher.publish(alert, state)
            except Exception:
                log.exception("gpuhealth: could not publish the alert")
        if hook is not None:
            try:
                hook(alert)
            except Exception:
                log.exception("gpuhealth: the alert hook raised")

    def steps(self, iterable: Iterable[T]) -> Iterator[T]:
        """The framework-free loop helper: yields the items, checking when due; ends on a stop."""
        for item in iterable:
            if self.tick():
                return
            yield item

    def _watch(self) -> None:
        while not self._halt.is_set():
            try:
                self.check_now()
            except Exception:
                log.exception("gpuhealth: background check failed")
            self._halt.wait(max(0.0, (self._next_due or 0.0) - self.clock()))

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.every_s))
        for part in (self.publisher, self.exporter, self.monitor):
            if part is not None:
                try:
                    part.close()
                except Exception:
                    log.exception("gpuhealth: closing %s failed", type(part).__name__)

    def __enter__(self) -> Andon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def andon_for(andon: Andon | None, options: dict[str, Any]) -> tuple[Andon, bool]:
    """The callbacks' Andon: the one given (the caller closes it), or a new one they own and close."""
    if andon is not None:
        if options:
            raise ValueError("pass either an Andon or the options to build one, not both")
        return andon, False
    return Andon(**options), True

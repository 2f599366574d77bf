"""The lifecycle loop: decide every GPU every `interval_s`, and at once when the inventory file changes.

A run loads the inventory (a file that cannot be read is recorded as the run's
problem, and every decision lists the inventory as missing), reads every
GPU's inputs, decides, and writes the inventory, the run and its decisions in
one transaction; then publishes the decisions on gpu-lifecycle. A run that
fails is counted and logged; the next tries again. `once` runs one and stops:
a cron job, or an operator who wants the answer now (docs/services/lifecycle.md).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.contract.models_lifecycle import DECISIONS
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import JsonProducer
from shared.store import lifecycle as store
from shared.store.errors import translated

from .calibration import load_calibration
from .inventory import Inventory, InventoryError, load_inventory
from .run import RunResult, baseline_p30, decide_fleet
from .settings import LifecycleSettings

log = logging.getLogger("services.lifecycle")
LIFECYCLE = TopicSettings.entry("lifecycle")  # its messages' key and value

FLUSH_TIMEOUT_S = 30.0


class LifecycleMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_lifecycle_"
        self.runs = Counter(p + "runs", "Decision runs, by trigger", ["trigger"], registry=registry)
        self.failures = Counter(p + "run_failures", "Decision runs that failed", registry=registry)
        self.seconds = Histogram(p + "run_seconds", "How long a run took", registry=registry)
        self.gpus = Gauge(p + "gpus", "GPUs by decision at the last run", ["decision"], registry=registry)
        self.waiting = Gauge(
            p + "cost_of_waiting_per_day",
            "What waiting costs per day, by decision",
            ["decision"],
            registry=registry,
        )
        self.inventory_rows = Gauge(p + "inventory_rows", "Inventory rows loaded", registry=registry)
        self.inventory_problems = Gauge(p + "inventory_problems", "Inventory rows refused", registry=registry)
        self.last_run = Gauge(p + "last_run_timestamp_seconds", "When the last run ended", registry=registry)

    def record(self, result: RunResult, seconds: float) -> None:
        self.seconds.observe(seconds)
        self.runs.labels(result.run["trigger"]).inc()
        for name in DECISIONS:
            rows = [r for r in result.rows if r["decision"] == name]
            self.gpus.labels(name).set(len(rows))
            self.waiting.labels(name).set(sum(r["cost_of_waiting_per_day"] for r in rows))
        self.inventory_rows.set(result.run["inventory_rows"])
        self.inventory_problems.set(result.run["inventory_problems"])
        self.last_run.set(time.time())


def inventory_rows(inventory: Inventory | None) -> list[tuple[Any, ...]]:
    """The loaded rows in lifecycle_inventory's column order."""
    return [
        (
            e.line,
            e.serial,
            e.gpu_uuid,
            e.purchase_date,
            e.purchase_price,
            e.warranty_end,
            e.rma_turnaround_days,
            e.spares_on_hand,
            e.note,
        )
        for e in (inventory.entries if inventory else ())
    ]


def inventory_problems(inventory: Inventory | None, problem: str | None) -> list[tuple[int, str | None, str]]:
    """The refused rows; line 0 alone where the whole file was refused."""
    if problem:
        return [(0, None, problem)]
    return [(p.line, p.gpu, p.problem) for p in inventory.problems] if inventory else []


class LifecycleLoop:
    def __init__(
        self, settings: LifecycleSettings, *, producer: JsonProducer, registry: CollectorRegistry
    ) -> None:
        self.settings, self.cfg, self.producer = settings, settings.lifecycle, producer
        self.calibration = load_calibration(
            self.cfg.predictor_calibration_file, weights_file=self.cfg.predictor_weights_file
        )
        self.baseline = baseline_p30(self.cfg.predictor_weights_file, self.calibration)
        self.metrics = LifecycleMetrics(registry)
        self._seen: tuple[float, int] | None = None  # the inventory file's (mtime, size) at the last load

    def run(self, stop: threading.Event) -> None:
        """Decide until `stop` is set (or once); what is queued is flushed however it ends."""
        try:
            self._run(stop)
        finally:
            if remaining := self.producer.flush(FLUSH_TIMEOUT_S):
                log.error("exiting with undelivered decisions", extra={"undelivered": remaining})

    def _run(self, stop: threading.Event) -> None:
        if self.cfg.once:
            self.run_once("once")
            return
        self.run_once("start")
        due = time.monotonic() + self.cfg.interval_s
        while not stop.wait(self.cfg.check_every_s):
            trigger = "inventory" if self._inventory_changed() else "schedule"
            if trigger == "inventory" or time.monotonic() >= due:
                self.run_once(trigger)
                due = time.monotonic() + self.cfg.interval_s

    def _stamp(self) -> tuple[float, int] | None:
        path = self.cfg.inventory_file
        try:
            st = path.stat() if path else None
        except OSError:
            return None
        return None if st is None else (st.st_mtime, st.st_size)

    def _inventory_changed(self) -> bool:
        return self._stamp() != self._seen

    def _inventory(self, today: datetime) -> tuple[Inventory | None, str | None]:
        path: Path | None = self.cfg.inventory_file
        self._seen = self._stamp()
        if path is None:
            return None, None
        try:
            return load_inventory(path, today=today.date()), None
        except InventoryError as e:
            log.error("inventory refused: %s", e)
            return None, str(e)

    def run_once(self, trigger: str, at: datetime | None = None) -> RunResult | None:
        """One run, as of `at` (now); None (counted and logged) when it failed."""
        started = time.perf_counter()
        at = at or datetime.now(UTC)
        inventory, problem = self._inventory(at)
        try:
            conn = connect(self.settings.db)
            try:
                gpus, seen = store.decision_inputs(
                    conn,
                    as_of=at,
                    since=at - timedelta(hours=self.cfg.window_h),
                    processes_since=at - timedelta(hours=self.cfg.processes_window_h),
                    resets_since=at - timedelta(days=30),
                )
                result = decide_fleet(
                    gpus,
                    inventory=inventory,
                    inventory_problem=problem,
                    remediation_seen=seen,
                    econ=self.settings.economics,
                    baseline=self.baseline,
                    calibration=self.calibration,
                    at=at,
                    trigger=trigger,
                    inventory_file=self.cfg.inventory_file,
                )
                store.replace_inventory(
                    conn,
                    rows=inventory_rows(inventory),
                    problems=inventory_problems(inventory, problem),
                    loaded_at=at,
                )
                store.write_run(conn, result.run, result.rows)
                with translated(conn):
                    conn.commit()
            finally:
                conn.close()
            for message in result.messages:
                self.producer.produce(self.settings.topics.lifecycle, *LIFECYCLE.encode(message))
            self.producer.poll(0)
        except (GpuHealthError, OSError) as e:
            self.metrics.failures.inc()
            log.error("decision run failed: %s", e)
            return None
        self.metrics.record(result, time.perf_counter() - started)
        counts = {name: sum(r["decision"] == name for r in result.rows) for name in DECISIONS}
        log.info(
            "run",
            extra={
                "trigger": trigger,
                "gpus": len(result.rows),
                "decisions": counts,
                "seconds": round(time.perf_counter() - started, 3),
            },
        )
        return result

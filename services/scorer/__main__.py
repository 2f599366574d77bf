"""`python -m services.scorer`: score the fleet every cycle until SIGTERM.

As-of time (GPUHEALTH_SCORER__AS_OF): `now` judges a live fleet against the
wall clock; `latest` judges it as of its newest sample (a replayed fleet, or
the mock running on an accelerated clock); an ISO-8601 time scores that moment
once and exits, for replays and evaluations.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, Field

from shared.config import Settings
from shared.db import connect
from shared.errors import GpuHealthError
from shared.kafka import JsonProducer, make_producer
from shared.models import to_json
from shared.models_health import HEALTH_STATES
from shared.service import serve_when_ready, start_service, stop_on_signals

from .alert_hosts import with_hostnames
from .cycle import CycleResult, run_cycle
from .features import Conn
from .predict import Prediction
from .rules_config import DEFAULT_RULES, load_rules
from .verdict_metrics import VerdictCollector

log = logging.getLogger("services.scorer")


class ScorerSection(BaseModel):
    """GPUHEALTH_SCORER__*"""

    interval_s: float = Field(default=30.0, ge=1, le=3600)
    predict_every_s: float = Field(default=300.0, ge=1)
    as_of: str = "now"
    rules_file: Path = DEFAULT_RULES
    metrics_port: int = Field(default=9502, ge=0, le=65535)
    metrics_bind: str = "127.0.0.1"


class ScorerSettings(Settings):
    scorer: ScorerSection = Field(default_factory=ScorerSection)


def resolve_as_of(conn: Conn, mode: str) -> datetime:
    if mode == "now":
        return datetime.now(UTC)
    if mode == "latest":
        row = conn.execute("SELECT max(time) FROM gpu_latest").fetchone()
        return row[0] if row and row[0] else datetime.now(UTC)
    parsed = datetime.fromisoformat(mode)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class ScorerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_scorer_"
        self.cycles = Counter(p + "cycles", "Scoring cycles completed", registry=registry)
        self.failures = Counter(p + "cycle_failures", "Scoring cycles that failed", registry=registry)
        self.seconds = Histogram(p + "cycle_seconds", "Time of one scoring cycle", registry=registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))  # fmt: skip
        self.gpus = Gauge(p + "gpus", "GPUs by overall state", ["state"], registry=registry)
        self.changes = Counter(p + "verdict_changes", "Verdict changes written", registry=registry)
        self.alerts = Counter(p + "alerts", "Alerts opened and resolved", ["transition"], registry=registry)

    def record(self, r: CycleResult, seconds: float) -> None:
        self.cycles.inc()
        self.seconds.observe(seconds)
        for state in HEALTH_STATES:
            self.gpus.labels(state).set(r.states.get(state, 0))
        self.changes.inc(r.verdict_changes)
        self.alerts.labels("opened").inc(r.alerts_opened)
        self.alerts.labels("resolved").inc(r.alerts_resolved)


def main() -> int:
    settings = start_service(ScorerSettings, "scorer")
    if settings is None:
        return 2
    try:
        rules = load_rules(settings.scorer.rules_file)
    except GpuHealthError as e:
        log.error("%s", e)
        return 2
    cfg = settings.scorer
    registry = CollectorRegistry()
    metrics = ScorerMetrics(registry)
    verdicts = VerdictCollector()
    registry.register(verdicts)
    stop_metrics = serve_when_ready("scorer", registry, cfg.metrics_port, cfg.metrics_bind, settings.db)
    if stop_metrics is None:
        return 1
    producer = JsonProducer(make_producer(settings.kafka))
    topic = {"health": settings.topics.health, "alerts": settings.topics.alerts}
    stop = stop_on_signals()
    once = cfg.as_of not in ("now", "latest")
    predictions: dict[str, Prediction] | None = None
    last_prediction = 0.0
    next_tick = time.monotonic()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with connect(settings.db) as conn:
                as_of = resolve_as_of(conn, cfg.as_of)
                due = time.monotonic() - last_prediction >= cfg.predict_every_s
                result = run_cycle(conn, as_of, rules, None if due else predictions)
                verdicts.refresh(conn, as_of)
                with_hostnames(conn, result.messages)
            if due:
                last_prediction = time.monotonic()
                predictions = result.predictions
            for kind, key, value in result.messages:
                producer.produce(topic[kind], key, to_json(value))
            producer.poll(0)
            metrics.record(result, time.perf_counter() - started)
            log.info(
                "cycle", extra={"as_of": as_of.isoformat(), "gpus": result.gpus, "states": result.states,
                                "changes": result.verdict_changes, "alerts_opened": result.alerts_opened,
                                "alerts_resolved": result.alerts_resolved,
                                "predictions_written": result.predictions_written,
                                "seconds": round(time.perf_counter() - started, 3)},
            )  # fmt: skip
        except (GpuHealthError, psycopg.Error, OSError) as e:
            metrics.failures.inc()
            log.error("scoring cycle failed: %s", e)
        if once:
            break
        next_tick += cfg.interval_s
        stop.wait(max(0.0, next_tick - time.monotonic()))
    producer.flush(30)
    stop_metrics()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

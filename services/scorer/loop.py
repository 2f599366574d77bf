"""The scorer's loop: one scoring cycle every `interval_s` until stopped, publishing what changed.

Each cycle opens a connection, judges the fleet as of `as_of` (see
:func:`resolve_as_of`), refreshes the per-GPU verdict series on /metrics and
queues the verdict changes and alerts on Kafka. Predictions are recomputed
every `predict_every_s`; between them the last ones are reused. A cycle that
fails is counted and logged; the next one tries again. Stopping (or an
error) ends with a flush of what is queued, in a `finally`.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import Field, field_validator

from shared.config import DatabaseSettings, Section, Settings, TopicSettings
from shared.db import connect, statements_cancelled_on
from shared.errors import GpuHealthError
from shared.kafka import JsonProducer, make_producer
from shared.models import to_json
from shared.models_health import HEALTH_STATES
from shared.store import fleet
from shared.store.errors import translated

from .alert_hosts import with_hostnames
from .cycle import CycleResult, run_cycle
from .features import Conn
from .predict import Prediction
from .rules_config import DEFAULT_RULES, Rules, load_rules
from .verdict_metrics import VerdictCollector

log = logging.getLogger("services.scorer")

FLUSH_TIMEOUT_S = 30.0


class ScorerSection(Section):
    """GPUHEALTH_SCORER__*: how often the fleet is judged, as of when, by which rules."""

    interval_s: float = Field(default=30.0, ge=1, le=3600)
    """How often every GPU is judged."""
    predict_every_s: float = Field(default=300.0, ge=1)
    """How often the failure predictions are recomputed."""
    as_of: str = "now"
    """The time judged: `now` (a live fleet), `latest` (the fleet's newest sample: a replay, or the mock
    on an accelerated clock) or an ISO-8601 time (one cycle, then exit)."""
    rules_file: Path = DEFAULT_RULES
    """Every threshold and window of the health rules."""
    metrics_port: int = Field(default=9502, ge=0, le=65535)
    """Port of the scorer's `/metrics`, verdicts included."""
    metrics_bind: str = "127.0.0.1"
    """Address of the scorer's `/metrics`."""

    @field_validator("as_of")
    @classmethod
    def _as_of(cls, value: str) -> str:
        if value not in ("now", "latest"):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"as_of must be 'now', 'latest' or an ISO time, not {value!r}") from None
        return value


class ScorerSettings(Settings):
    scorer: ScorerSection = Field(default_factory=ScorerSection)


def resolve_as_of(conn: Conn, mode: str) -> datetime:
    if mode == "now":
        return datetime.now(UTC)
    if mode == "latest":
        return fleet.newest_sample_time(conn) or datetime.now(UTC)
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


class ScorerLoop:
    """Scores the fleet every `interval_s` (once, for a fixed as-of time) and publishes the changes."""

    def __init__(
        self,
        *,
        cfg: ScorerSection,
        rules: Rules,
        db: DatabaseSettings,
        topics: TopicSettings,
        producer: JsonProducer,
        registry: CollectorRegistry,
    ) -> None:
        self.cfg, self.rules, self.db, self.producer = cfg, rules, db, producer
        self.topic = {"health": topics.health, "alerts": topics.alerts}
        self.metrics = ScorerMetrics(registry)
        self.verdicts = VerdictCollector()
        registry.register(self.verdicts)
        self.once = cfg.as_of not in ("now", "latest")
        self.predictions: dict[str, Prediction] | None = None
        self.last_prediction = 0.0
        self._conn: Conn | None = None  # the cycle's, while it runs (cancelled at stop)

    def run(self, stop: threading.Event) -> None:
        """Score until `stop` is set (or once); what is queued is flushed however it ends."""
        next_tick = time.monotonic()
        # A cycle stuck in a statement at stop (a lock, a server gone quiet) is cancelled after a grace.
        with statements_cancelled_on(stop, lambda: [] if self._conn is None else [self._conn]):
            self._run(stop, next_tick)

    def _run(self, stop: threading.Event, next_tick: float) -> None:
        try:
            while not stop.is_set():
                self.score_once()
                if self.once:
                    break
                next_tick += self.cfg.interval_s
                stop.wait(max(0.0, next_tick - time.monotonic()))
        finally:
            if remaining := self.producer.flush(FLUSH_TIMEOUT_S):
                log.error("exiting with undelivered messages", extra={"undelivered": remaining})

    def score_once(self) -> CycleResult | None:
        """One cycle; None (counted and logged) when it failed."""
        started = time.perf_counter()
        try:
            conn = self._conn = connect(self.db)
            try:  # the store translates its statements' errors; a bug here still raises as itself
                as_of = resolve_as_of(conn, self.cfg.as_of)
                due = time.monotonic() - self.last_prediction >= self.cfg.predict_every_s
                result = run_cycle(conn, as_of, self.rules, None if due else self.predictions)
                self.verdicts.refresh(conn, as_of)
                with_hostnames(conn, result.messages)
                with translated(conn):
                    conn.commit()
            finally:
                self._conn = None
                conn.close()
            if due:
                self.last_prediction = time.monotonic()
                self.predictions = result.predictions
            for kind, key, value in result.messages:
                self.producer.produce(self.topic[kind], key, to_json(value))
            self.producer.poll(0)
        except (GpuHealthError, OSError) as e:
            self.metrics.failures.inc()
            log.error("scoring cycle failed: %s", e)
            return None
        self.metrics.record(result, time.perf_counter() - started)
        log.info(
            "cycle", extra={"as_of": as_of.isoformat(), "gpus": result.gpus, "states": result.states,
                            "changes": result.verdict_changes, "alerts_opened": result.alerts_opened,
                            "alerts_resolved": result.alerts_resolved,
                            "predictions_written": result.predictions_written,
                            "seconds": round(time.perf_counter() - started, 3)},
        )  # fmt: skip
        return result


def build_scorer(
    settings: ScorerSettings, *, registry: CollectorRegistry, producer: JsonProducer | None = None
) -> ScorerLoop:
    """The scorer `settings` describe; ConfigError when the rules file is invalid."""
    return ScorerLoop(
        cfg=settings.scorer,
        rules=load_rules(settings.scorer.rules_file),
        db=settings.db,
        topics=settings.topics,
        producer=JsonProducer(make_producer(settings.kafka)) if producer is None else producer,
        registry=registry,
    )

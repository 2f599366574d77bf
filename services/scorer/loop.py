"""The scorer's loop: one scoring cycle every `interval_s` until stopped, publishing what changed.

Each cycle opens a connection, judges this process's share of the fleet
(ownership.py: every GPU, or those keyed to the gpu-events partitions its
consumer group gave it) as of `as_of` (see :func:`resolve_as_of`), refreshes
the per-GPU verdict series on /metrics and queues the verdict changes and
alerts on Kafka. When the share changes, the next cycle starts at once, so a
GPU handed over by a rebalance waits for no interval. Predictions are
recomputed every `predict_every_s`; between them the last ones are reused (a
GPU just handed over starts from its newest prediction in the database). A
cycle that fails is counted and logged; the next one tries again. Stopping (or
an error) ends with a flush of what is queued, in a `finally`.

Beside it, the event fast path (event_path.py) judges a GPU at once on its
events; build.py's :func:`build_scorer` builds both.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.contract.models import GpuEvent
from shared.contract.models_health import HEALTH_STATES
from shared.contract.signing import Signer
from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import JsonProducer
from shared.settings.common import DatabaseSettings, TopicSettings
from shared.store import fleet, judging
from shared.store.errors import translated

from .alert_hosts import with_hostnames
from .cycle import CycleResult, judge_in_chunks
from .features import Conn
from .messages import publish
from .ownership import Ownership
from .predict import Prediction
from .rules_config import Rules
from .settings import ScorerSection
from .verdict_metrics import VerdictCollector

log = logging.getLogger("services.scorer")

FLUSH_TIMEOUT_S = 30.0
# A cycle judges again a GPU with an event this far older than its last judgement: one stored late (a
# sink catching up), where the event fast path is off or missed it.
LATE_EVENT_S = 300.0


def resolve_as_of(conn: Conn, mode: str) -> datetime:
    if mode == "now":
        return datetime.now(UTC)
    if mode == "latest":
        return fleet.newest_sample_time(conn) or datetime.now(UTC)
    parsed = datetime.fromisoformat(mode)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def event_as_of(mode: str) -> Callable[[Conn, Sequence[GpuEvent]], datetime]:
    """The fast path's as-of time: the cycle's, or the newest of the events judged if that is later
    (a collector's clock a little ahead), so the events are never in the judgement's future."""

    def as_of(conn: Conn, found: Sequence[GpuEvent]) -> datetime:
        return max(resolve_as_of(conn, mode), *(e.time for e in found))

    return as_of


class ScorerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_scorer_"
        self.cycles = Counter(p + "cycles", "Scoring cycles completed", registry=registry)
        self.failures = Counter(p + "cycle_failures", "Scoring cycles that failed", registry=registry)
        self.seconds = Histogram(
            p + "cycle_seconds",
            "Time of one scoring cycle",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.gpus = Gauge(p + "gpus", "GPUs by overall state", ["state"], registry=registry)
        self.changes = Counter(p + "verdict_changes", "Verdict changes written", registry=registry)
        self.alerts = Counter(p + "alerts", "Alerts opened and resolved", ["transition"], registry=registry)

    def record(self, r: CycleResult, seconds: float, states: dict[str, int]) -> None:
        """A cycle's result; `states`: the share's GPUs by overall state after it."""
        self.cycles.inc()
        self.seconds.observe(seconds)
        for state in HEALTH_STATES:
            self.gpus.labels(state).set(states.get(state, 0))
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
        ownership: Ownership | None = None,
        signer: Signer | None = None,
    ) -> None:
        """`signer`: signs each message (None: they go unsigned, and a remediator refuses them)."""
        self.cfg, self.rules, self.db, self.producer, self.signer = cfg, rules, db, producer, signer
        self.topic = {"health": topics.health, "alerts": topics.alerts}
        self.metrics = ScorerMetrics(registry)
        self.verdicts = VerdictCollector()
        registry.register(self.verdicts)
        self.once = cfg.as_of not in ("now", "latest")
        self.ownership = Ownership(everything=True) if ownership is None else ownership  # None: in no group
        self.predictions: dict[str, Prediction] = {}  # this share's, as last computed here
        self.predicted_at: dict[str, float] = {}  # when (monotonic)
        self.judged_all = False  # the first cycle judges the whole share: the rules may be new

    def run(self, stop: threading.Event) -> None:
        """Score until `stop` is set (or once); what is queued is flushed however it ends."""
        next_tick = time.monotonic()
        try:
            while not stop.is_set():
                self.ownership.changed.clear()
                if self.ownership.share.everything or self.ownership.share.partitions:
                    self.score_once(stop)
                if self.once:
                    break
                next_tick = self._wait(stop, next_tick + self.cfg.interval_s)
        finally:
            if remaining := self.producer.flush(FLUSH_TIMEOUT_S):
                log.error("exiting with undelivered messages", extra={"undelivered": remaining})

    def _wait(self, stop: threading.Event, tick: float) -> float:
        """Until `tick`, or until the share changes (its new GPUs are judged at once); the tick to keep."""
        while not stop.wait(min(0.2, max(0.0, tick - time.monotonic()))):
            if self.ownership.changed.is_set():
                return time.monotonic()
            if time.monotonic() >= tick:
                break
        return tick

    def score_once(self, stop: threading.Event | None = None) -> CycleResult | None:
        """One cycle over this process's share of the fleet, in chunks (`cycle_chunk`), each published
        once committed; ended early by `stop`; None (counted and logged) when it failed."""
        started = time.perf_counter()
        try:
            conn = connect(self.db)

            def emit(chunk: CycleResult) -> None:
                with_hostnames(conn, chunk.messages)
                publish(self.producer, self.signer, self.topic, chunk.messages)

            try:  # the store translates its statements' errors; a bug here still raises as itself
                as_of = resolve_as_of(conn, self.cfg.as_of)
                share = self.ownership.share
                gpus = share.select(judging.inventory_gpus(conn))
                result = self._judge(conn, as_of, gpus, None if share.everything else gpus, stop, emit)
                self.verdicts.refresh(conn, as_of, gpus)
                with translated(conn):
                    conn.commit()
            finally:
                conn.close()
        except (GpuHealthError, OSError) as e:
            self.metrics.failures.inc()
            log.error("scoring cycle failed: %s", e)
            return None
        self.metrics.record(result, time.perf_counter() - started, self.verdicts.states())
        log.info(
            "cycle",
            extra={
                "as_of": as_of.isoformat(),
                "share": len(gpus),
                "gpus": result.gpus,
                "skipped": len(result.skipped),
                "partitions": sorted(share.partitions),
                "states": result.states,
                "changes": result.verdict_changes,
                "alerts_opened": result.alerts_opened,
                "alerts_resolved": result.alerts_resolved,
                "predictions_written": result.predictions_written,
                "seconds": round(time.perf_counter() - started, 3),
            },
        )
        return result

    def _judge(
        self,
        conn: Conn,
        as_of: datetime,
        gpus: list[str],
        scope: list[str] | None,
        stop: threading.Event | None,
        committed: Callable[[CycleResult], None],
    ) -> CycleResult:
        """Judge the share's GPUs that can have changed (all of them the first time), each prediction
        recomputed at its GPU's first judgement `predict_every_s` after the last; `scope` None: the fleet.
        A fixed as-of time has no "since": each of its cycles judges the whole share."""
        if self.judged_all and not self.once:
            judged: list[str] | None = judging.needing_judgement(
                conn,
                as_of,
                scope,
                missing_after_s=self.rules.availability.missing_after_s,
                late_s=LATE_EVENT_S,
                every_s=self.cfg.rejudge_every_s,
            )
        else:
            judged = scope  # the whole share; None reads the whole fleet unfiltered
        now = time.monotonic()
        due = [
            g
            for g in (gpus if judged is None else judged)
            if now - self.predicted_at.get(g, -math.inf) >= self.cfg.predict_every_s
        ]
        result = judge_in_chunks(
            conn,
            as_of,
            self.rules,
            gpus if judged is None else judged,
            chunk=self.cfg.cycle_chunk,
            predictions=self.predictions,
            predict=due,
            stop=stop,
            committed=committed,
        )
        self.judged_all = self.judged_all or not result.cut_short
        held = set(gpus)
        for g in due:
            self.predicted_at[g] = now
        self.predictions = {g: p for g, p in {**self.predictions, **result.predictions}.items() if g in held}
        self.predicted_at = {g: t for g, t in self.predicted_at.items() if g in held}
        return result

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
events; :func:`build_scorer` builds both.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import Field, field_validator

from shared.contract.models import GpuEvent
from shared.contract.models_health import HEALTH_STATES
from shared.contract.signing import Signer, SigningSettings, load_signer
from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import DatabaseSettings, Section, Settings, TopicSettings
from shared.store import fleet, judging
from shared.store.errors import translated

from .alert_hosts import with_hostnames
from .cycle import CycleResult, judge_in_chunks
from .event_path import EventPath
from .features import Conn
from .messages import publish
from .ownership import Ownership
from .predict import Prediction
from .rules_config import DEFAULT_RULES, Rules, load_rules
from .verdict_metrics import VerdictCollector

log = logging.getLogger("services.scorer")

FLUSH_TIMEOUT_S = 30.0
# A cycle judges again a GPU with an event this far older than its last judgement: one stored late (a
# sink catching up), where the event fast path is off or missed it.
LATE_EVENT_S = 300.0


class ScorerSection(Section):
    """GPUHEALTH_SCORER__*: how often the fleet is judged, as of when, by which rules."""

    interval_s: float = Field(default=30.0, ge=1, le=3600)
    """How often a cycle runs: it judges every GPU whose verdict can have changed (a finding, an alert, an
    event, silence, or its own minute come round: `rejudge_every_s`)."""
    rejudge_every_s: int = Field(default=60, ge=1, le=3600)
    """A GPU with nothing new is judged again this often (the rollup's minute), each at its own phase."""
    predict_every_s: float = Field(default=300.0, ge=1)
    """How often each GPU's failure prediction is recomputed (at its next judgement after this long)."""
    as_of: str = "now"
    """The time judged: `now` (a live fleet), `latest` (the fleet's newest sample: a replay, or the mock
    on an accelerated clock) or an ISO-8601 time (one cycle, then exit)."""
    rules_file: Path = DEFAULT_RULES
    """Every threshold and window of the health rules."""
    metrics_port: int = Field(default=9502, ge=0, le=65535)
    """Port of the scorer's `/metrics`, verdicts included."""
    metrics_bind: str = "127.0.0.1"
    """Address of the scorer's `/metrics`."""
    events: bool = True
    """Judge a GPU at once on each of its gpu-events messages (the event fast path), as a member of `group`;
    off, this process judges every GPU, and only every cycle."""
    group: str = Field(default="gpuhealth-scorer", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    """The scorers' consumer group on gpu-events: its members share the fleet by the topic's partitions."""
    signing: SigningSettings = Field(default_factory=SigningSettings)
    """How the scorer signs what it publishes (`private_key_file`): a remediator acts on nothing unsigned."""
    session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    """How long the group waits on a silent scorer before its GPUs move to the others. Kept under
    `interval_s`, a scorer that dies leaves its GPUs unjudged for at most two intervals."""
    event_batch: int = Field(default=500, ge=1, le=100_000)
    """Most gpu-events messages judged in one transaction."""
    cycle_chunk: int = Field(default=500, ge=1, le=1_000_000)
    """Most GPUs a cycle writes in one transaction (it reads and judges its share at once). Each chunk
    commits and is published before the next is written, so an event on a GPU the cycle is writing waits
    for one chunk, not the cycle, and a stop is heard between chunks."""

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
        self.seconds = Histogram(p + "cycle_seconds", "Time of one scoring cycle", registry=registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))  # fmt: skip
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
            "cycle", extra={"as_of": as_of.isoformat(), "share": len(gpus), "gpus": result.gpus,
                            "skipped": len(result.skipped), "partitions": sorted(share.partitions),
                            "states": result.states, "changes": result.verdict_changes,
                            "alerts_opened": result.alerts_opened, "alerts_resolved": result.alerts_resolved,
                            "predictions_written": result.predictions_written,
                            "seconds": round(time.perf_counter() - started, 3)},
        )  # fmt: skip
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
                conn, as_of, scope, missing_after_s=self.rules.availability.missing_after_s,
                late_s=LATE_EVENT_S, every_s=self.cfg.rejudge_every_s,
            )  # fmt: skip
        else:
            judged = scope  # the whole share; None reads the whole fleet unfiltered
        now = time.monotonic()
        due = [g for g in (gpus if judged is None else judged)
               if now - self.predicted_at.get(g, -math.inf) >= self.cfg.predict_every_s]  # fmt: skip
        result = judge_in_chunks(conn, as_of, self.rules, gpus if judged is None else judged,
                                 chunk=self.cfg.cycle_chunk, predictions=self.predictions, predict=due,
                                 stop=stop, committed=committed)  # fmt: skip
        self.judged_all = self.judged_all or not result.cut_short
        held = set(gpus)
        for g in due:
            self.predicted_at[g] = now
        self.predictions = {g: p for g, p in {**self.predictions, **result.predictions}.items() if g in held}
        self.predicted_at = {g: t for g, t in self.predicted_at.items() if g in held}
        return result


@dataclass(slots=True)
class Scorer:
    """The cycle, and the event fast path beside it (None: off, or one fixed as-of time)."""

    cycle: ScorerLoop
    events: EventPath | None


def build_scorer(
    settings: ScorerSettings, *, registry: CollectorRegistry, producer: JsonProducer | None = None
) -> Scorer:
    """The scorer `settings` describe; ConfigError when the rules file is invalid."""
    cfg = settings.scorer
    rules = load_rules(cfg.rules_file)
    signer = load_signer(cfg.signing)
    if signer is None:
        log.warning(
            "no signing key (GPUHEALTH_SCORER__SIGNING__PRIVATE_KEY_FILE): verdicts and alerts go"
            " unsigned, and a remediator refuses them"
        )
    else:
        log.info("verdicts and alerts are signed with key %s", signer.kid)
    producer = JsonProducer(make_producer(settings.kafka)) if producer is None else producer
    in_group = cfg.events and cfg.as_of in ("now", "latest")
    ownership = Ownership(everything=not in_group)
    cycle = ScorerLoop(
        cfg=cfg,
        rules=rules,
        db=settings.db,
        topics=settings.topics,
        producer=producer,
        registry=registry,
        ownership=ownership,
        signer=signer,
    )
    if not in_group:
        return Scorer(cycle, None)
    session_ms = int(cfg.session_timeout_s * 1000)
    events = EventPath(
        rules=rules, db=settings.db, kafka=settings.kafka, topic=settings.topics.events, group=cfg.group,
        consumer_overrides={
            "session.timeout.ms": session_ms, "heartbeat.interval.ms": max(1000, session_ms // 5),
        },
        batch=cfg.event_batch, producer=producer, publish_to=cycle.topic, ownership=ownership,
        as_of=event_as_of(cfg.as_of), lookback_s=max(60.0, 2 * cfg.interval_s + cfg.session_timeout_s),
        registry=registry, signer=signer,
    )  # fmt: skip
    return Scorer(cycle, events)

"""The scorer its settings describe: the cycle and the event fast path beside it (`build_scorer`, for its
`main` and the tests), and the service `python -m services.scorer` runs (`ScorerService`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from shared.contract.signing import load_signer
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import Loop, ServiceRun, stopped

from .event_path import EventPath
from .loop import FLUSH_TIMEOUT_S, ScorerLoop, event_as_of
from .ownership import Ownership
from .rules_config import load_rules
from .settings import ScorerSettings

log = logging.getLogger("services.scorer")


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
        rules=rules,
        db=settings.db,
        kafka=settings.kafka,
        topic=settings.topics.events,
        group=cfg.group,
        consumer_overrides={
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(1000, session_ms // 5),
        },
        batch=cfg.event_batch,
        producer=producer,
        publish_to=cycle.topic,
        ownership=ownership,
        as_of=event_as_of(cfg.as_of),
        lookback_s=max(60.0, 2 * cfg.interval_s + cfg.session_timeout_s),
        registry=registry,
        signer=signer,
    )
    return Scorer(cycle, events)


class ScorerService:
    """`python -m services.scorer`: the scorer, its /metrics (verdicts included), the event path's thread."""

    def __init__(self, settings: ScorerSettings) -> None:
        """ConfigError when the rules file is invalid."""
        self.settings = settings
        self.registry = CollectorRegistry()
        self.scorer = build_scorer(settings, registry=self.registry)

    def start(self, life: ServiceRun) -> Loop:
        cfg, scorer = self.settings.scorer, self.scorer
        life.serve_metrics(self.registry, cfg.metrics_port, cfg.metrics_bind, database=self.settings.db)
        if scorer.events is not None:
            # Closed in reverse: the event thread is joined, then what it queued is flushed.
            life.callback(scorer.cycle.producer.close, FLUSH_TIMEOUT_S)
            life.start_thread(scorer.events, "scorer-events")
        return scorer.cycle  # its producer is flushed at the end of run, however it ends

    def stopped(self) -> int:
        return stopped(log)

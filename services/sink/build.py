"""The sink's loops, assembled once (for `main`, the evaluation and the tests), and their one teardown.

A loop's consumer and batch writer are owned by whoever built it, never by the
loop: `sink_loop_closed` (or `close_sink_loop`) closes them once, after the
loop's run has ended.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import timedelta

from prometheus_client import CollectorRegistry

from shared.plumbing.kafka import close_consumer, closing_consumer, make_consumer, make_producer
from shared.plumbing.running import Loop, ServiceRun, stopped
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings

from .loop import DEPTH, SinkLoop
from .metrics import SinkMetrics
from .retention import Retention
from .rollup import RollupRefresher
from .settings import SinkSection, SinkSettings
from .verifications import VerificationLoop
from .workload import WorkloadLoop
from .writer import BatchWriter

log = logging.getLogger("services.sink")


def build_sink_loop(
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    cfg: SinkSection,
    *,
    metrics: SinkMetrics,
    housekeeping: Callable[[], None] = lambda: None,
    rollup: RollupRefresher | None = None,
) -> SinkLoop:
    """The loop that stores gpu-metrics-raw and gpu-events, in consumer group `cfg.group_id`."""
    return SinkLoop(
        consumer=make_consumer(
            kafka, group_id=cfg.group_id, overrides={"session.timeout.ms": cfg.session_timeout_ms}
        ),
        dlq_producer=make_producer(kafka),
        writer=BatchWriter(
            db,
            group=cfg.group_id,
            statement_timeout_ms=cfg.statement_timeout_ms,
            connections=cfg.lanes * DEPTH,
        ),
        topics=topics,
        metrics=metrics,
        batch_size=cfg.batch_size,
        poll_timeout_s=cfg.poll_timeout_s,
        max_message_bytes=cfg.max_message_bytes,
        max_backoff_s=cfg.max_backoff_s,
        housekeeping=housekeeping,
        # reads the dead-letter topic (never commits) to check a letter whose delivery was in doubt
        dlq_reader=lambda: make_consumer(kafka, group_id=f"{cfg.group_id}-dlq-check"),
        rollup=rollup,
    )


def build_verification_loop(
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    cfg: SinkSection,
    *,
    metrics: SinkMetrics,
) -> VerificationLoop:
    """The loop that stores gpu-verifications and gpu-systems, in group `<cfg.group_id>-records`."""
    group = f"{cfg.group_id}-records"
    return VerificationLoop(
        consumer=make_consumer(kafka, group_id=group),
        dlq_producer=make_producer(kafka),
        db=db,
        topics=topics,
        group=group,
        metrics=metrics,
        max_message_bytes=cfg.max_message_bytes,
        max_backoff_s=cfg.max_backoff_s,
        dlq_reader=lambda: make_consumer(kafka, group_id=f"{group}-dlq-check"),
    )


def close_sink_loop(loop: SinkLoop) -> None:
    """Close what the loop was given: its consumer (leaving the group) and its writer; safe twice."""
    try:
        close_consumer(loop.consumer)
    finally:
        loop.writer.close()


@contextmanager
def sink_loop_closed(loop: SinkLoop) -> Iterator[SinkLoop]:
    """`loop`, its consumer and writer closed once when the block ends (after its run has ended)."""
    try:
        yield loop
    finally:
        close_sink_loop(loop)


class SinkService:
    """`python -m services.sink`: the sink loop, and beside it the records loop (gpu-verifications and
    gpu-systems: verifications.py) and the workload loop (gpu-processes and llm-sessions: workload.py),
    with retention and the rollup's refresh, once the database is there."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.metrics = SinkMetrics(self.registry)
        self.loops: list[VerificationLoop | WorkloadLoop] = []

    def start(self, life: ServiceRun) -> Loop:
        cfg = self.settings.sink
        life.serve_metrics(self.registry, cfg.metrics_port, cfg.metrics_bind, database=self.settings.db)
        return Sinking(self, life)

    def open(self, life: ServiceRun) -> SinkLoop:
        """The loops, each entered into `life`, the records' and the workload's started on threads."""
        settings, cfg, metrics = self.settings, self.settings.sink, self.metrics
        # Closed by this stack once the loops have ended, the last entered first.
        retention = life.enter_context(closing(self._retention()))
        rollup = RollupRefresher(
            settings.db,
            metrics,
            interval_s=cfg.rollup_refresh_s,
            caught_up_s=cfg.rollup_caught_up_s,
            keep_raw=timedelta(days=cfg.keep_raw_days),
            statement_timeout_ms=cfg.statement_timeout_ms,
            complete_for=(cfg.group_id, settings.topics.metrics_raw),
        )
        loop = life.enter_context(
            sink_loop_closed(
                build_sink_loop(
                    settings.kafka,
                    settings.db,
                    settings.topics,
                    cfg,
                    metrics=metrics,
                    housekeeping=retention,
                    rollup=rollup,
                )
            )
        )
        verification = build_verification_loop(
            settings.kafka, settings.db, settings.topics, cfg, metrics=metrics
        )
        life.enter_context(closing_consumer(verification.consumer))
        # The sink allocates ~100 short-lived objects a message. Startup objects are frozen out
        # of the collector's way, and young collections run every 50k allocations rather than
        # 700: measured ~2 µs less CPU a message. Nothing here builds reference cycles.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        workload = life.enter_context(
            WorkloadLoop.from_settings(settings, group_id=cfg.group_id, metrics=metrics)
        )
        life.start_thread(workload, "sink-workload")
        life.start_thread(verification, "sink-records")
        self.loops = [verification, workload]
        log.info("sinking", extra={"topics": settings.topics.stored_by("metrics")})
        return loop

    def _retention(self) -> Retention:
        cfg = self.settings.sink
        return Retention(
            self.settings.db,
            self.metrics,
            keep_raw_days=cfg.keep_raw_days,
            keep_events_days=cfg.keep_events_days,
            keep_rollup_days=cfg.keep_rollup_days,
            interval_s=cfg.retention_interval_s,
            archive_dir=cfg.archive_dir,
            archive_block_kib=cfg.archive_block_kib,
            archive_zstd_level=cfg.archive_zstd_level,
        )

    def stopped(self) -> int:
        if any(loop.failed for loop in self.loops):
            log.error("stopped: a records loop failed")
            return 1
        return stopped(log)


@dataclass(frozen=True, slots=True)
class Sinking:
    """The started sink's loop: its loops are opened (after /metrics and the database) and run."""

    service: SinkService
    life: ServiceRun

    def run(self, stop: threading.Event) -> None:
        self.service.open(self.life).run(stop)

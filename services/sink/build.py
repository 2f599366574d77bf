"""The sink's loops, assembled once (for `main`, the evaluation and the tests), and their one teardown.

A loop's consumer and batch writer are owned by whoever built it, never by the
loop: `sink_loop_closed` (or `close_sink_loop`) closes them once, after the
loop's run has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from shared.plumbing.kafka import close_consumer, make_consumer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings

from .loop import DEPTH, SinkLoop
from .metrics import SinkMetrics
from .rollup import RollupRefresher
from .settings import SinkSection
from .verifications import VerificationLoop
from .writer import BatchWriter


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

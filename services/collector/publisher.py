"""Publishing to Kafka without blocking the poll loop or losing data silently.

The bounded queue is librdkafka's own: `queue.buffering.max.messages` caps it
and `message.timeout.ms=0` keeps retrying a message until the broker takes it,
so a broker outage costs latency, not samples. When the bound is hit the new
message is dropped, counted in `gpuhealth_collector_dropped_total` and logged
(at most once every 10 s, with the running count), never silently.

With a spool (services.collector.spool), what is still queued when the collector
stops is written to disk instead of being lost, and sent before anything new at
the next start.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import confluent_kafka

from shared.plumbing.errors import ContractError, KafkaProduceError
from shared.plumbing.kafka import make_producer
from shared.settings.common import KafkaSettings

from .metrics import CollectorMetrics
from .spool import SpooledRecord, SpoolFile, SpoolingProducer

log = logging.getLogger(__name__)


class Producer(Protocol):
    """What the publisher needs of shared.plumbing.kafka.JsonProducer (tests pass a fake)."""

    delivered: int
    failed: int

    def produce(self, topic: str, key: str | None, value: Any) -> None: ...
    def poll(self, timeout_s: float = 0.0) -> int: ...
    def flush(self, timeout_s: float = 30.0) -> int: ...
    def __len__(self) -> int: ...


def collector_producer(settings: KafkaSettings, max_queued: int) -> confluent_kafka.Producer:
    return make_producer(
        settings,
        {
            "queue.buffering.max.messages": max_queued,
            "message.timeout.ms": 0,  # retry until delivered
            "client.id": f"{settings.client_id}-collector",
        },
    )


class Publisher:
    def __init__(self, producer: Producer, metrics: CollectorMetrics, spool: SpoolFile | None = None) -> None:
        if spool is not None and not isinstance(producer, SpoolingProducer):
            raise TypeError("a spool needs a SpoolingProducer")
        self._producer = producer
        self._metrics = metrics
        self._last_drop_log = 0.0
        self._dropped = 0
        self._spool = spool
        self._resend: deque[tuple[int, SpooledRecord]] = deque()  # spooled, not yet queued again
        self._resending = 0  # queued again, not yet acknowledged
        metrics.queue_depth.set_function(lambda: len(producer) + len(self._resend))

    def resume(self, delivered: Callable[[list[tuple[int, SpooledRecord]]], set[int]] | None = None) -> int:
        """Queue what the last run spooled, ahead of anything new; returns how many messages.

        `delivered` names the spooled records Kafka has already (spool.delivered_already); they are skipped.
        """
        if self._spool is None:
            return 0
        pending = self._spool.load()
        if pending and delivered is not None:
            there = delivered(pending)
            for index in sorted(there):
                self._spool.mark_delivered(index)
            self._spool.sync()
            pending = [(index, record) for index, record in pending if index not in there]
            if there:
                log.info(
                    "spooled messages found in Kafka already are not resent", extra={"messages": len(there)}
                )
        self._resend = deque(pending)
        if not self._resend:
            self._spool.remove()  # a spool whose every record was delivered before a crash
            return 0
        log.info(
            "resending spooled messages",
            extra={"messages": len(self._resend), "spool": str(self._spool.path)},
        )
        self._queue_spooled()
        return len(self._resend) + self._resending

    def _queue_spooled(self) -> None:
        assert isinstance(self._producer, SpoolingProducer)
        while self._resend:
            index, record = self._resend[0]
            try:
                self._producer.produce_record(record, partial(self._resent, index))
            except KafkaProduceError:
                return  # the queue is full; the rest goes in as it drains
            self._resend.popleft()
            self._resending += 1

    def _resent(self, index: int) -> None:
        assert self._spool is not None
        self._spool.mark_delivered(index)
        self._resending -= 1
        self._metrics.spool_resent.inc()
        if not self._resending and not self._resend:
            self._spool.remove()
            log.info("every spooled message was delivered", extra={"spool": str(self._spool.path)})

    def publish(self, topic: str, key: str, value: dict[str, Any]) -> bool:
        """Queue one message; False when it had to be dropped (counted and logged)."""
        try:
            self._producer.produce(topic, key, value)
        except KafkaProduceError as e:
            self._dropped += 1
            self._metrics.dropped.inc()
            now = time.monotonic()
            if now - self._last_drop_log >= 10:
                self._last_drop_log = now
                log.error(
                    "dropping messages: %s",
                    e,
                    extra={"topic": topic, "dropped_total": self._dropped},
                )
            return False
        except ContractError as e:
            self._metrics.invalid.labels("encode").inc()
            log.error("message could not be encoded: %s", e, extra={"topic": topic})
            return False
        return True

    @property
    def delivered(self) -> int:
        """Messages the broker has acknowledged so far."""
        return self._producer.delivered

    def serve(self) -> None:
        """Run delivery callbacks and mirror the producer's counts into metrics."""
        self._producer.poll(0)
        if self._spool is not None:
            self._queue_spooled()
            self._spool.sync()
        self._metrics.sync_delivery(self._producer.delivered, self._producer.failed)

    def flush(self, timeout_s: float) -> int:
        remaining = self._producer.flush(timeout_s)
        self._metrics.sync_delivery(self._producer.delivered, self._producer.failed)
        return remaining

    def close(self, timeout_s: float) -> int:
        """Flush for up to `timeout_s`, then spool what the broker has not taken; returns the number lost."""
        remaining = self.flush(timeout_s)
        if self._spool is None or not isinstance(self._producer, SpoolingProducer):
            if remaining:
                log.error("exiting with undelivered messages", extra={"undelivered": remaining})
            return remaining
        self._spool.sync()
        if not remaining and not self._resend:
            self._spool.close()
            return 0
        records = self._producer.purge() + [record for _, record in self._resend]
        try:
            lost = self._spool.save(records)
        except OSError as e:
            lost = len(records)
            log.error(
                "the spool could not be written: %d undelivered messages are lost: %s",
                lost,
                e,
                extra={"spool": str(self._spool.path)},
            )
        self._metrics.spooled.inc(len(records) - lost)
        self._metrics.spool_lost.inc(lost)
        log.warning(
            "the broker did not take every message: spooled for the next start",
            extra={"spooled": len(records) - lost, "lost": lost, "spool": str(self._spool.path)},
        )
        return lost

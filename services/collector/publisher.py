"""Publishing to Kafka without blocking the poll loop or losing data silently.

The bounded queue is librdkafka's own: `queue.buffering.max.messages` caps it
and `message.timeout.ms=0` keeps retrying a message until the broker takes it,
so a broker outage costs latency, not samples. When the bound is hit the new
message is dropped, counted in `gpuhealth_collector_dropped_total` and logged
(at most once every 10 s, with the running count), never silently.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import confluent_kafka

from shared.config import KafkaSettings
from shared.errors import ContractError, KafkaProduceError
from shared.kafka import make_producer

from .metrics import CollectorMetrics

log = logging.getLogger(__name__)


class Producer(Protocol):
    """What the publisher needs of shared.kafka.JsonProducer (tests pass a fake)."""

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
    def __init__(self, producer: Producer, metrics: CollectorMetrics) -> None:
        self._producer = producer
        self._metrics = metrics
        self._last_drop_log = 0.0
        self._dropped = 0
        metrics.queue_depth.set_function(lambda: len(producer))

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
        self._metrics.sync_delivery(self._producer.delivered, self._producer.failed)

    def flush(self, timeout_s: float) -> int:
        remaining = self._producer.flush(timeout_s)
        self._metrics.sync_delivery(self._producer.delivered, self._producer.failed)
        return remaining

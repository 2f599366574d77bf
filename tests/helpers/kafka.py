"""Reading topics back in integration tests."""

from __future__ import annotations

import time
import uuid

import confluent_kafka

from shared.config import KafkaSettings
from shared.kafka import make_consumer


def header_map(msg: confluent_kafka.Message) -> dict[str, str]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return {str(k): v.decode() if isinstance(v, bytes) else str(v) for k, v in items}


def consume_all(
    settings: KafkaSettings, topic: str, expected: int, timeout_s: float = 30.0, *, linger_s: float = 0.0
) -> list[confluent_kafka.Message]:
    """Read `topic` from the start until `expected` messages arrived or the deadline passed.

    `linger_s`: once `expected` arrived, go on reading that long, so that a test can see
    messages that should not be there (a duplicate) without betting on the join's speed.
    """
    consumer = make_consumer(settings, group_id=f"test-{uuid.uuid4().hex[:8]}")
    consumer.subscribe([topic])
    messages: list[confluent_kafka.Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                messages.append(msg)
        linger_until = time.monotonic() + linger_s
        while linger_s and time.monotonic() < linger_until:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                messages.append(msg)
    finally:
        consumer.close()
    return messages

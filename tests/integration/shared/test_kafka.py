"""JSON through the real broker with the project's producer and consumer factories."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import confluent_kafka
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.plumbing.errors import ContractError
from shared.plumbing.kafka import (
    JsonProducer,
    closing_consumer,
    decode_json,
    key_partition,
    make_consumer,
    make_producer,
    take,
)
from shared.settings.common import KafkaSettings
from tests.helpers.kafka import consume_all


def test_json_roundtrip_keeps_values_keys_and_order_per_key(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    producer = JsonProducer(make_producer(kafka_settings))
    keys = [f"GPU-{uuid.uuid4()}" for _ in range(8)]
    sent = [
        {
            "schema_version": 1,
            "gpu_uuid": keys[i % 8],
            "seq": i,
            "temp_c": 40.5 + i,
            "name": "Ünïcødé",
        }
        for i in range(400)
    ]
    for value in sent:
        producer.produce(topic, str(value["gpu_uuid"]), value, headers={"source": "test"})
    assert producer.flush(30) == 0
    assert (producer.delivered, producer.failed) == (400, 0)

    received = consume_all(kafka_settings, topic, expected=400)
    assert len(received) == 400
    decoded = [decode_json(m.value()) for m in received]
    assert sorted(d["seq"] for d in decoded) == list(range(400))
    partitions_by_key: dict[str, set[int]] = {}
    for msg, value in zip(received, decoded, strict=True):
        assert msg.key() == value["gpu_uuid"].encode()
        assert dict(msg.headers() or []) == {"source": b"test"}
        assert value == sent[value["seq"]]
        partitions_by_key.setdefault(value["gpu_uuid"], set()).add(int(msg.partition() or 0))
    # Keyed by GPU UUID: one GPU's samples stay on one partition, in order.
    assert all(len(p) == 1 for p in partitions_by_key.values())
    for key in keys:
        seqs = [d["seq"] for d in decoded if d["gpu_uuid"] == key]
        assert seqs == sorted(seqs)


def test_invalid_values_are_refused_before_they_reach_the_broker(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=1)
    producer = JsonProducer(make_producer(kafka_settings))
    with pytest.raises(ContractError, match="non-finite"):
        producer.produce(topic, "k", {"power_w": float("nan")})
    with pytest.raises(ContractError, match="exceeds"):
        producer.produce(topic, "k", {"blob": "x" * 1_100_000})
    producer.produce(topic, "k", {"ok": True})
    assert producer.flush(30) == 0
    received = consume_all(kafka_settings, topic, expected=1)
    assert [decode_json(m.value()) for m in received] == [{"ok": True}]


PARTITION_COUNTS = (1, 6, 7, 12)


@pytest.fixture
def partitioned(topic_factory: Callable[..., str]) -> dict[str, int]:
    """A topic per partition count: name -> partitions."""
    return {topic_factory(partitions=n, prefix=f"p{n}"): n for n in PARTITION_COUNTS}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(
        st.uuids().map(lambda u: f"GPU-{u}") | st.text(min_size=1, max_size=60),
        min_size=1,
        max_size=40,
        unique=True,
    )
)
def test_the_partition_computed_for_a_key_is_where_the_broker_puts_it(
    kafka_settings: KafkaSettings, partitioned: dict[str, int], keys: list[str]
) -> None:
    # The scorers share the fleet by computing each GPU's partition (shared.plumbing.kafka.key_partition); the
    # producers' partitioner is what actually places a record. Both must agree, record by record.
    producer = make_producer(kafka_settings)
    placed: list[tuple[str, bytes, int]] = []

    def delivered(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
        assert err is None, err
        placed.append((str(msg.topic()), msg.key() or b"", int(msg.partition() or 0)))

    for topic in partitioned:
        for key in keys:
            producer.produce(topic, key=key.encode(), value=b"{}", on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(placed) == len(keys) * len(partitioned)
    for topic, raw, partition in placed:
        assert partition == key_partition(raw, partitioned[topic]), (topic, raw)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=st.integers(1, 40), most=st.integers(1, 50))
def test_take_returns_what_has_arrived_without_waiting_for_a_full_batch(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str], sent: int, most: int
) -> None:
    """A quiet topic: `take` hands over the messages there are, in order and at most `most`, without
    waiting out its wait for a batch that will never fill (consume(most, wait) does; that was a delay
    on every event the scorer's fast path judged)."""
    topic = topic_factory(partitions=1)
    producer = JsonProducer(make_producer(kafka_settings))
    for i in range(sent):
        producer.produce(topic, "k", {"seq": i})
    assert producer.flush(30) == 0
    consumer = make_consumer(kafka_settings, group_id=f"take-{uuid.uuid4().hex[:8]}")
    with closing_consumer(consumer):
        consumer.subscribe([topic])
        got: list[int] = []
        started = time.monotonic()
        while len(got) < sent and time.monotonic() - started < 60:
            batch = [m for m in take(consumer, most, 30.0) if m.error() is None]
            assert len(batch) <= most
            got += [decode_json(m.value())["seq"] for m in batch]
        waited = time.monotonic() - started
        assert take(consumer, most, 0.2) == []  # nothing more: an empty batch after its wait
    assert got == list(range(sent))
    # not one 30 s wait for a batch of `most` (a generous bound: the group's join is in it too)
    assert waited < 25

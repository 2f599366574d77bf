"""JSON through the real broker with the project's producer and consumer factories."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import confluent_kafka
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.config import KafkaSettings
from shared.errors import ContractError
from shared.kafka import JsonProducer, decode_json, key_partition, make_producer
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
    # The scorers share the fleet by computing each GPU's partition (shared.kafka.key_partition); the
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

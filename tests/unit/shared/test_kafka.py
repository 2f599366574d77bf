"""JSON encoding for Kafka, producer defaults, and error translation, without a broker."""

from __future__ import annotations

import time
import zlib
from typing import Any

import confluent_kafka
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.plumbing.errors import ContractError, KafkaProduceError, KafkaUnavailableError
from shared.plumbing.kafka import (
    PRODUCER_DEFAULTS,
    JsonProducer,
    client_config,
    decode_json,
    encode_json,
    key_partition,
    translate_error,
    wait_for_kafka,
)
from shared.settings.common import KafkaSettings


def test_encode_is_compact_utf8_and_roundtrips() -> None:
    value = {"gpu": "GPU-ä", "temp_c": 41.5, "xid": None, "list": [1, 2.5, "x"]}
    raw = encode_json(value)
    assert raw == '{"gpu":"GPU-ä","temp_c":41.5,"xid":null,"list":[1,2.5,"x"]}'.encode()
    assert decode_json(raw) == value


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), {"a": {"b": [1.0, float("-inf")]}}, [float("nan")]],
)
def test_non_finite_numbers_are_refused(value: Any) -> None:
    with pytest.raises(ContractError, match="non-finite"):
        encode_json(value)


def test_unserialisable_values_are_refused() -> None:
    with pytest.raises(ContractError, match="cannot be encoded"):
        encode_json({"when": time})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "no value"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"a": 1', "not JSON"),
        (b"", "not JSON"),
        (b'{"power_w": NaN}', "NaN"),
        (b'{"power_w": -Infinity}', "Infinity"),
        (b"\x00\x01\x02", "not JSON"),
    ],
)
def test_decode_rejects_hostile_bytes_with_a_reason(raw: bytes | None, reason: str) -> None:
    with pytest.raises(ContractError, match=reason):
        decode_json(raw)


def test_producer_defaults_are_the_safe_ones() -> None:
    assert PRODUCER_DEFAULTS["enable.idempotence"] is True
    assert PRODUCER_DEFAULTS["acks"] == "all"
    assert PRODUCER_DEFAULTS["compression.type"] in {"lz4", "zstd"}
    assert PRODUCER_DEFAULTS["linger.ms"] > 0


def test_client_config_carries_credentials_and_extras() -> None:
    settings = KafkaSettings.model_validate(
        {
            "bootstrap_servers": "b:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "u",
            "sasl_password": "s3cret",
            "extra": {"ssl.ca.location": "/ca.pem"},
        }
    )
    config = client_config(settings)
    assert config["sasl.password"] == "s3cret"
    assert config["ssl.ca.location"] == "/ca.pem"
    assert config["bootstrap.servers"] == "b:9093"


def test_error_translation() -> None:
    down = translate_error(confluent_kafka.KafkaError(confluent_kafka.KafkaError._ALL_BROKERS_DOWN), "x")
    assert isinstance(down, KafkaUnavailableError)
    timed_out = translate_error(confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT), "y")
    assert isinstance(timed_out, KafkaProduceError)
    assert timed_out.code == "_MSG_TIMED_OUT"


def test_no_broker_is_a_clear_unavailable_error() -> None:
    # Port 9 (discard) on loopback: nothing listens, so the connection is refused.
    with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:9\b"):
        wait_for_kafka(KafkaSettings(bootstrap_servers="127.0.0.1:9"), timeout_s=1.0)


class FullQueueProducer:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("Local: Queue full")

    def poll(self, timeout: float) -> int:
        return 0


def test_full_local_queue_is_a_retriable_produce_error() -> None:
    producer = JsonProducer(FullQueueProducer())  # type: ignore[arg-type]
    with pytest.raises(KafkaProduceError) as caught:
        producer.produce("t", "k", {"a": 1})
    assert caught.value.retriable


def test_the_partitioner_is_stated_so_a_key_partition_can_be_computed() -> None:
    assert PRODUCER_DEFAULTS["partitioner"] == "consistent_random"
    assert client_config(KafkaSettings(extra={"partitioner": "murmur2"})) | PRODUCER_DEFAULTS == (
        client_config(KafkaSettings()) | PRODUCER_DEFAULTS
    )  # an extra cannot move the records away from where the scorers look for them


@given(key=st.binary(min_size=1, max_size=200), partitions=st.integers(1, 10_000))
def test_a_key_partition_is_crc32_of_the_key_within_the_topic(key: bytes, partitions: int) -> None:
    assert key_partition(key, partitions) == zlib.crc32(key) % partitions
    assert 0 <= key_partition(key, partitions) < partitions


@given(text=st.text(min_size=1, max_size=60))
def test_a_text_key_is_placed_by_its_utf8_bytes(text: str) -> None:
    assert key_partition(text, 7) == key_partition(text.encode(), 7)


@pytest.mark.parametrize(("key", "partitions"), [("", 6), (b"", 6), ("GPU-1", 0), ("GPU-1", -3)])
def test_keys_without_a_partition_are_refused(key: str | bytes, partitions: int) -> None:
    with pytest.raises(ValueError, match=r"empty key|at least one partition"):
        key_partition(key, partitions)

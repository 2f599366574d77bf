"""Producing JSON to Kafka with the project's safe defaults, and librdkafka's errors as the project's.

Producers are idempotent (`enable.idempotence`, `acks=all`), compress with lz4
and batch (`linger.ms`). The services' clients (shared.plumbing.kafka) and the training
library's publisher produce through this module; it needs confluent-kafka, so
the library imports it only when a publisher connects.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import confluent_kafka

from gpuhealth.errors import ContractError, KafkaError, KafkaProduceError, KafkaUnavailableError

from .kafka_settings import MAX_MESSAGE_BYTES, PRODUCER_DEFAULTS, KafkaSettings, client_config

log = logging.getLogger(__name__)


def log_client_error(err: confluent_kafka.KafkaError) -> None:
    # librdkafka reports transient connection trouble here and retries by itself.
    log.warning("kafka client error: %s", err.str(), extra={"kafka_code": err.name()})


def make_producer(
    settings: KafkaSettings, overrides: Mapping[str, Any] | None = None
) -> confluent_kafka.Producer:
    """An idempotent, compressing, batching producer."""
    config = client_config(settings) | PRODUCER_DEFAULTS | {"error_cb": log_client_error}
    config.update(overrides or {})
    return confluent_kafka.Producer(config)


def translate_error(err: confluent_kafka.KafkaError, context: str) -> KafkaError:
    """Map a librdkafka error onto the project's exception types."""
    cls: type[KafkaError] = KafkaError
    if err.code() in (
        confluent_kafka.KafkaError._TRANSPORT,
        confluent_kafka.KafkaError._ALL_BROKERS_DOWN,
        confluent_kafka.KafkaError._TIMED_OUT,
    ):
        cls = KafkaUnavailableError
    elif err.code() in (
        confluent_kafka.KafkaError._MSG_TIMED_OUT,
        confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE,
    ):
        cls = KafkaProduceError
    return cls(f"{context}: {err.str()}", code=err.name(), retriable=err.retriable())


def _reject_non_finite(value: Any) -> Any:
    """Walk a JSON-bound value and refuse NaN/inf, which JSON cannot carry."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ContractError(f"non-finite number {value!r} cannot be encoded as JSON")
    if isinstance(value, Mapping):
        for item in value.values():
            _reject_non_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _reject_non_finite(item)
    return value


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN/inf and unserialisable values raise ContractError."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()
    except ValueError as e:
        _reject_non_finite(value)
        raise ContractError(f"value cannot be encoded as JSON: {e}") from e
    except TypeError as e:
        raise ContractError(f"value cannot be encoded as JSON: {e}") from e


class JsonProducer:
    """Produces JSON values keyed by a string; counts what was delivered and what failed."""

    def __init__(self, producer: confluent_kafka.Producer) -> None:
        self._producer = producer
        self.delivered = 0
        self.failed = 0
        self.last_error: KafkaError | None = None

    def _on_delivery(self, err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        self.last_error = translate_error(err, f"delivery to {msg.topic()} failed")
        log.error("%s", self.last_error, extra={"topic": msg.topic(), "kafka_code": err.name()})

    def produce(
        self,
        topic: str,
        key: str | None,
        value: Any,
        *,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> None:
        """Queue one message; raises KafkaProduceError if the local queue is full."""
        payload = encode_json(value)
        if len(payload) > MAX_MESSAGE_BYTES:
            raise ContractError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
        try:
            self._producer.produce(
                topic,
                value=payload,
                key=key.encode() if key is not None else None,
                headers=list(headers.items()) if headers else None,
                on_delivery=self._on_delivery,
            )
        except BufferError as e:
            raise KafkaProduceError("local producer queue is full", retriable=True) from e
        except confluent_kafka.KafkaException as e:
            raise translate_error(e.args[0], f"produce to {topic} failed") from e
        self._producer.poll(0)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        served: int = self._producer.poll(timeout_s)
        return served

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for queued messages; returns how many are still undelivered."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining

    def __len__(self) -> int:
        return len(self._producer)

    def __enter__(self) -> JsonProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, timeout_s: float = 30.0) -> int:
        """Flush for up to `timeout_s`, saying what was left undelivered; safe to call twice."""
        remaining = self.flush(timeout_s)
        if remaining:
            log.error("exiting with undelivered messages", extra={"undelivered": remaining})
        return remaining

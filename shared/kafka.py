"""Kafka clients with the project's safe defaults, JSON encoding, and typed errors.

Producers are idempotent (`enable.idempotence`, `acks=all`), compress with lz4
and batch (`linger.ms`). Consumers never auto-commit: the sink commits offsets
itself, after its database transaction. Every librdkafka error that leaves this
module is one of the project's :mod:`shared.errors` types.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient

from shared.config import KafkaSettings
from shared.errors import ContractError, KafkaError, KafkaProduceError, KafkaUnavailableError

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # Keep retrying a message for 10 minutes before reporting it lost, so a
    # broker restart or a short outage costs latency, not data.
    "message.timeout.ms": 600_000,
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "session.timeout.ms": 45_000,
    "max.poll.interval.ms": 300_000,
}

# Messages bigger than this are refused by the broker's default message.max.bytes.
MAX_MESSAGE_BYTES = 1_000_000


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection properties shared by producers, consumers and admin clients."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        config["sasl.mechanism"] = settings.sasl_mechanism
    if settings.sasl_username:
        config["sasl.username"] = settings.sasl_username
    if settings.sasl_password:
        config["sasl.password"] = settings.sasl_password.get_secret_value()
    config.update(settings.extra)
    return config


def _on_client_error(err: confluent_kafka.KafkaError) -> None:
    # librdkafka reports transient connection trouble here and retries by itself.
    log.warning("kafka client error: %s", err.str(), extra={"kafka_code": err.name()})


def make_producer(
    settings: KafkaSettings, overrides: Mapping[str, Any] | None = None
) -> confluent_kafka.Producer:
    """An idempotent, compressing, batching producer."""
    config = client_config(settings) | PRODUCER_DEFAULTS | {"error_cb": _on_client_error}
    config.update(overrides or {})
    return confluent_kafka.Producer(config)


def make_consumer(
    settings: KafkaSettings, *, group_id: str, overrides: Mapping[str, Any] | None = None
) -> confluent_kafka.Consumer:
    """A consumer in `group_id` that never commits offsets on its own."""
    config = client_config(settings) | CONSUMER_DEFAULTS | {"group.id": group_id}
    config["error_cb"] = _on_client_error
    config.update(overrides or {})
    return confluent_kafka.Consumer(config)


def close_consumer(consumer: confluent_kafka.Consumer) -> None:
    """Leave the group and close; a consumer closed already is left as it is."""
    try:
        consumer.close()
    except RuntimeError:  # "Consumer closed": closing twice is not an error here
        log.debug("consumer was closed already")


@contextmanager
def closing_consumer(consumer: confluent_kafka.Consumer) -> Iterator[confluent_kafka.Consumer]:
    """`consumer`, closed (once) when the block ends, however it ends."""
    try:
        yield consumer
    finally:
        close_consumer(consumer)


def make_admin(settings: KafkaSettings) -> AdminClient:
    return AdminClient(client_config(settings) | {"error_cb": _on_client_error})


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


def wait_for_kafka(settings: KafkaSettings, timeout_s: float = 30.0) -> int:
    """Block until the cluster answers a metadata request; return its broker count."""
    admin = make_admin(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except confluent_kafka.KafkaException as e:
        raise KafkaUnavailableError(
            f"no Kafka broker answered at {settings.bootstrap_servers} within {timeout_s:g} s",
            retriable=True,
        ) from e
    return len(metadata.brokers)


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


def _refuse_constant(name: str) -> Any:
    raise ContractError(f"JSON constant {name} is not a number this project accepts")


def decode_json(raw: bytes | None) -> Any:
    """Parse UTF-8 JSON strictly: bad UTF-8, bad JSON, NaN/Infinity all raise ContractError."""
    if raw is None:
        raise ContractError("message has no value")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as e:
        raise ContractError(f"value is not UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise ContractError(f"value is not JSON: {e}") from e


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

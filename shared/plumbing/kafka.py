"""Kafka clients with the project's safe defaults, JSON encoding, and typed errors.

Producers are idempotent (`enable.idempotence`, `acks=all`), compress with lz4
and batch (`linger.ms`): the producer side is the library's (gpuhealth.kafka,
which the training library's publisher uses too), read here with the rest.
Consumers never auto-commit: the sink commits offsets itself, after its
database transaction. Every librdkafka error that leaves this module is one of
the project's :mod:`shared.plumbing.errors` types.

A keyed record's partition is part of the contract: the scorers share the fleet
by the partitions of gpu-events their consumer group assigns them, so each must
know which partition a GPU's records land in. Producers name their partitioner
(`consistent_random`) and `key_partition` computes the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient

from gpuhealth.kafka import JsonProducer as JsonProducer
from gpuhealth.kafka import encode_json as encode_json
from gpuhealth.kafka import log_client_error
from gpuhealth.kafka import make_producer as make_producer
from gpuhealth.kafka import translate_error as translate_error
from gpuhealth.kafka_settings import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from gpuhealth.kafka_settings import PRODUCER_DEFAULTS as PRODUCER_DEFAULTS
from gpuhealth.kafka_settings import client_config as client_config
from gpuhealth.kafka_settings import key_partition as key_partition
from shared.plumbing.errors import ContractError, KafkaUnavailableError
from shared.settings.common import KafkaSettings

log = logging.getLogger(__name__)

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "session.timeout.ms": 45_000,
    "max.poll.interval.ms": 300_000,
}


def make_consumer(
    settings: KafkaSettings, *, group_id: str, overrides: Mapping[str, Any] | None = None
) -> confluent_kafka.Consumer:
    """A consumer in `group_id` that never commits offsets on its own."""
    config = client_config(settings) | CONSUMER_DEFAULTS | {"group.id": group_id}
    config["error_cb"] = log_client_error
    config.update(overrides or {})
    return confluent_kafka.Consumer(config)


def take(consumer: confluent_kafka.Consumer, most: int, wait_s: float) -> list[confluent_kafka.Message]:
    """Up to `most` messages (errors included, as `consume` gives them): waits up to `wait_s` for the
    first, then takes only what has already arrived. `consume(most, wait_s)` itself waits out all of
    `wait_s` unless `most` arrive, a delay on every message of a quiet topic."""
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, 0)] if most > 1 else [first]


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
    return AdminClient(client_config(settings) | {"error_cb": log_client_error})


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

"""Delivering dead letters: every one acknowledged by the broker before the batch's offsets move on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import confluent_kafka

from shared.errors import KafkaProduceError

from .decode import DeadLetter

log = logging.getLogger(__name__)


def deliver_dead_letters(producer: confluent_kafka.Producer, topic: str, dead: Sequence[DeadLetter]) -> None:
    """Produce each to `topic` and wait for the acks; KafkaProduceError (retriable) if any is lost."""
    failures: list[str] = []

    def on_delivery(err: confluent_kafka.KafkaError | None, _: confluent_kafka.Message) -> None:
        if err is not None:
            failures.append(err.str())

    for letter in dead:
        producer.produce(
            topic, value=letter.value, key=letter.key, headers=letter.headers(), on_delivery=on_delivery
        )
    if producer.flush(30) or failures:
        raise KafkaProduceError(f"dead letters not delivered: {failures[:1] or 'timeout'}", retriable=True)
    for letter in dead:
        log.warning(
            "dead letter: %s",
            letter.reason,
            extra={"topic": letter.topic, "partition": letter.partition, "offset": letter.offset},
        )

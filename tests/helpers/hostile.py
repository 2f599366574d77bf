"""Hostile-record runs for the sink's property tests: produce drafts, know where each must end up,
read the dead letters back; and the hostile values the drafts are made of.

A test's `HostileRun` subclass turns one draft into a `Produced` message (topic, key, value, the
name its stored row will carry, and whether the contract and the test's CHECK let it be stored);
`produce` sends the drafts and returns what must be stored and what must be dead-lettered, by
the offsets the broker gave them; `drain` reads the dead-letter topic, checking each letter's group.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import confluent_kafka
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from evaluation.pipeline import wait_until
from services.sink.metrics import SinkMetrics
from services.sink.records import RecordFamilyLoop
from shared.config import DatabaseSettings, KafkaSettings, TopicSettings
from shared.db import connect
from shared.kafka import make_consumer, make_producer
from tests.helpers.kafka import header_map

ANY_TEXT = st.text(st.characters(codec=None), max_size=12)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
NUMBERS = st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from([5e-324, 1e308, 2**63 - 1, -0.0])


def deep(n: int) -> str:
    """JSON nested `n` lists deep: what makes a recursive parser give up."""
    return "[" * n + "]" * n


L = TypeVar("L", bound=RecordFamilyLoop)
Source = tuple[str, int, int]  # (topic, partition, offset) of a record


class Produced(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None
    name: str  # what identifies its stored row (the suffix of a GPU UUID or hostname)
    accepted: Callable[[], bool] | bool  # it must be stored (a callable: decided at delivery)
    refused_by_db: bool = False  # the contract takes it, the test's CHECK refuses it


@dataclass
class HostileRun(ABC):
    """What the examples share: one producer, one reader of the dead-letter topic, the tallies."""

    topics: TopicSettings
    db: DatabaseSettings
    group: str
    producer: confluent_kafka.Producer
    dlq: confluent_kafka.Consumer
    n: int = 0  # records produced so far (also makes each GPU, host and time unique)
    stored: int = 0
    dead: set[Source] = field(default_factory=set)
    refused_by_db: int = 0
    dead_seen: list[Source] = field(default_factory=list)

    @abstractmethod
    def message(self, draft: Any, i: int) -> Produced:
        """The i-th produced message, made from `draft`."""


def produce(run: HostileRun, drafts: list[Any]) -> tuple[set[str], set[Source]]:
    """Produce the drafts: the names of what must be stored, the sources of what must be dead letters."""
    must_store: set[str] = set()
    must_die: set[Source] = set()

    def delivered(produced: Produced) -> Callable[..., None]:
        def done(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            assert err is None, err
            accepted = produced.accepted() if callable(produced.accepted) else produced.accepted
            if accepted:
                must_store.add(produced.name)
            else:
                must_die.add((msg.topic() or "", msg.partition() or 0, msg.offset() or 0))
                run.refused_by_db += produced.refused_by_db

        return done

    for draft in drafts:
        run.n += 1
        produced = run.message(draft, run.n)
        run.producer.produce(
            produced.topic, key=produced.key, value=produced.value, on_delivery=delivered(produced)
        )
    assert run.producer.flush(30) == 0
    return must_store, must_die


def drain(run: HostileRun) -> int:
    """Read what the dead-letter topic has now; how many letters were seen so far."""
    for msg in run.dlq.consume(1000, 0.2):
        if msg.error() is None:
            h = header_map(msg)
            assert h["dlq.consumer_group"] == run.group
            run.dead_seen.append(
                (h["dlq.source.topic"], int(h["dlq.source.partition"]), int(h["dlq.source.offset"]))
            )
    return len(run.dead_seen)


def dead_letters_in_topic(kafka: KafkaSettings, topic: str) -> int:
    """Messages in the dead-letter topic (its partitions' end offsets: nothing is ever deleted there)."""
    consumer = make_consumer(kafka, group_id=f"count-{uuid.uuid4().hex[:8]}")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def await_dead_letters(run: HostileRun, must_die: set[Source]) -> None:
    """Wait for this example's dead letters; then every record that must die did so exactly once."""
    wait_until(lambda: drain(run) >= len(run.dead) + len(must_die), 60, "the dead letters")
    run.dead |= must_die
    assert len(run.dead_seen) == len(set(run.dead_seen)), "a record was dead-lettered twice"
    assert set(run.dead_seen) == run.dead  # each other record exactly once


def dead_letter_ledger(db: DatabaseSettings, group: str) -> tuple[int, int]:
    """(letters recorded but not delivered, letters the database refused) in sink_dead_letters."""
    with connect(db) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE delivered_at IS NULL),"
            " count(*) FILTER (WHERE category = 'database') FROM sink_dead_letters WHERE consumer_group = %s",
            (group,),
        ).fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


def records_loop(
    loop_type: type[L],
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    group: str,
    *,
    max_message_bytes: int,
) -> L:
    """A records loop (verifications, workload) as the hostile runs want it: quick retries, a size limit."""
    return loop_type(
        consumer=make_consumer(kafka, group_id=group), dlq_producer=make_producer(kafka), db=db,
        topics=topics, group=group, metrics=SinkMetrics(CollectorRegistry()),
        max_message_bytes=max_message_bytes, max_backoff_s=1,
        dlq_reader=lambda: make_consumer(kafka, group_id=f"{group}-dlq-check"),
    )  # fmt: skip

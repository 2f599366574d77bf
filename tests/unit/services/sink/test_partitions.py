"""Telling a sink that has caught up from one whose fetch is running late (partitions.fetched_all)."""

from __future__ import annotations

from typing import Any, cast

import confluent_kafka
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from services.sink import partitions as under_test

UNKNOWN = confluent_kafka.OFFSET_INVALID  # -1001: no position or end known yet
TRANSPORT = confluent_kafka.KafkaError._TRANSPORT


class Consumer:
    """Positions and cached partition ends, as a consumer reports them after a fetch."""

    def __init__(self, partitions: dict[int, tuple[int, int]], fail: bool = False) -> None:
        self.partitions, self.fail = partitions, fail  # partition -> (position, end)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("raw", p) for p in self.partitions]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if self.fail:
            raise confluent_kafka.KafkaException(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT)
            )
        return [TopicPartition(tp.topic, tp.partition, self.partitions[tp.partition][0]) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        assert cached, "no broker round trip from the consume loop"
        return 0, self.partitions[tp.partition][1]


def fetched_all(consumer: Consumer) -> bool:
    return under_test.fetched_all(cast(Any, consumer))


def test_a_partition_with_messages_left_to_fetch_is_not_caught_up() -> None:
    assert not fetched_all(Consumer({0: (500, 500), 1: (120, 20_000)}))


def test_every_partition_at_its_end_is_caught_up() -> None:
    assert fetched_all(Consumer({0: (500, 500), 1: (20_000, 20_000)}))


def test_a_transaction_marker_at_the_end_is_not_a_message_left() -> None:
    assert fetched_all(Consumer({0: (199_999, 200_000)}))


def test_what_is_not_known_yet_does_not_hold_back() -> None:
    assert fetched_all(Consumer({0: (UNKNOWN, 500), 1: (30, UNKNOWN), 2: (UNKNOWN, UNKNOWN)}))
    assert fetched_all(Consumer({}))


def test_a_consumer_that_cannot_say_counts_as_caught_up() -> None:
    """Then the rollup refreshes everything, as it did before it could tell: never stuck."""
    assert fetched_all(Consumer({0: (0, 10_000)}, fail=True))


@given(
    st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)), max_size=8)
)
def test_caught_up_exactly_when_no_partition_has_two_or_more_messages_left(
    partitions: dict[int, tuple[int, int]],
) -> None:
    left = [end - position for position, end in partitions.values()]
    assert fetched_all(Consumer(partitions)) == all(n <= 1 for n in left)

"""`take` off the happy grid, on the real broker: partition-EOF errors, one message at a time, a rebalance.

Two consumers of one group read a topic as the scorer's event path does: `take`,
the error messages dropped, the batch's next offsets committed. A second member
joins at a random moment. Every message is handed over, none is lost, and one
is handed over twice only if the batch it came in could not be committed (its
partition was revoked under it): what a commit covers never comes again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import confluent_kafka
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.scorer.event_path import _failed, _next_offsets
from shared.plumbing.kafka import JsonProducer, closing_consumer, make_consumer, make_producer, take
from shared.settings.common import KafkaSettings

Key = tuple[int, int]  # (partition, offset)


class Member:
    """One group member reading with `take(most)` and committing each batch, until told to stop."""

    def __init__(self, kafka: KafkaSettings, topic: str, group: str, most: int) -> None:
        self.consumer = make_consumer(kafka, group_id=group, overrides={
            "enable.partition.eof": True, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
        })  # fmt: skip
        self.topic, self.most = topic, most
        self.seen: list[Key] = []
        self.uncommitted: set[Key] = set()
        self.errors: list[str] = []
        self.assigned = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with closing_consumer(self.consumer):
            self.consumer.subscribe([self.topic], on_assign=lambda _c, _p: self.assigned.set())
            while not self.stop.is_set():
                found = take(self.consumer, self.most, 0.2)
                if len(found) > self.most:
                    self.errors.append(f"take gave {len(found)} > {self.most}")
                records = [m for m in found if not _failed(m)]
                if not records:
                    continue
                keys = [(int(m.partition() or 0), int(m.offset() or 0)) for m in records]
                self.seen += keys
                try:
                    self.consumer.commit(offsets=_next_offsets(records), asynchronous=False)
                except confluent_kafka.KafkaException:  # revoked under it: its next owner reads it again
                    self.uncommitted |= set(keys)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=st.integers(20, 120), most=st.sampled_from([1, 1, 2, 7, 500]), join_after=st.floats(0, 1))
def test_take_with_eof_errors_and_a_rebalance_loses_nothing_and_repeats_only_the_uncommitted(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str], sent: int, most: int, join_after: float
) -> None:
    topic = topic_factory(partitions=4)
    group = f"take-{uuid.uuid4().hex[:8]}"
    producer = JsonProducer(make_producer(kafka_settings, {"linger.ms": 0}))
    first = Member(kafka_settings, topic, group, most)
    second = Member(kafka_settings, topic, group, most)
    first.thread.start()
    deadline = time.monotonic() + 40
    joins = int(join_after * (sent - 10))  # at least 10 messages after the second member has partitions
    for seq in range(sent):
        producer.produce(topic, f"gpu-{seq}", {"seq": seq})
        producer.poll(0)
        if seq == joins:
            second.thread.start()
            while not second.assigned.wait(0.1):  # the rebalance, the first member reading on meanwhile
                assert time.monotonic() < deadline, "the second member was never given partitions"
    assert producer.flush(10) == 0
    members = (first, second)
    try:
        while (got := len({k for m in members for k in m.seen})) < sent:
            assert time.monotonic() < deadline, f"{got} of {sent} taken"
            time.sleep(0.1)
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.thread.join(15)
    taken = Counter(k for m in members for k in m.seen)
    assert len(taken) == sent  # every message handed over, by one member or the other
    again = {k for k, n in taken.items() if n > 1}
    assert again <= first.uncommitted | second.uncommitted, sorted(again)
    assert second.seen, "the rebalance gave the second member nothing to read"
    assert first.errors + second.errors == []

"""A sink loop's partitions: resumed from the database, held while backing off, committed and measured.

Every consume loop of the sink (loop.py's samples and events, records.py's
verifications and workload) owns its partitions the same way, written once
here: on assignment each partition resumes from the next offset the database
stored for the loop's group (the database is the truth; a partition it never
saw starts at the beginning), retried with backoff while the database is
away; while a batch is retried the consumer is paused and still polled, so it
keeps its place in the group, and whatever that poll returns is held for the
next batch, never dropped; a stored batch's offsets are committed to Kafka as
a courtesy (so `kafka-consumer-groups` shows lag); the lag per partition is
measured from the stored offsets, not the consumer's position.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import confluent_kafka
from prometheus_client import Gauge

from shared.plumbing.errors import DatabaseError
from shared.store.offsets import Partition

log = logging.getLogger(__name__)


def resume_from_database(
    consumer: confluent_kafka.Consumer,
    partitions: list[confluent_kafka.TopicPartition],
    read_stored: Callable[[list[Partition]], dict[Partition, int]],
    *,
    stop: threading.Event,
    max_backoff_s: float,
    on_retry: Callable[[], None] = lambda: None,
) -> dict[Partition, int]:
    """Assign `partitions` at the offsets the database stored (retried until read, or until `stop`).

    Returns the stored offsets read ({} if stopped before they could be).
    """
    wanted = [(p.topic, p.partition) for p in partitions]
    delay = 0.5
    while True:
        try:
            stored = read_stored(wanted)
            break
        except DatabaseError as e:
            on_retry()
            if stop.is_set():
                stored = {}
                break
            log.warning("cannot read stored offsets, retrying in %.1f s: %s", delay, e)
            stop.wait(delay)
            delay = min(delay * 2, max_backoff_s)
    for p in partitions:
        p.offset = stored.get((p.topic, p.partition), confluent_kafka.OFFSET_BEGINNING)
    consumer.assign(partitions)
    return stored


def poll_paused(
    consumer: confluent_kafka.Consumer,
    seconds: float,
    held: list[confluent_kafka.Message],
    tick: Callable[[], None] = lambda: None,
    stop: threading.Event | None = None,
) -> None:
    """Back off for `seconds` (less if `stop` is set) while polling the paused consumer.

    Pausing stops fetching, but what was fetched before can still come out of poll():
    it is appended to `held`, never dropped (dropped, the consumer's position would pass
    it, and the next stored offsets with it). `tick` runs after every poll.
    """
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and not (stop is not None and stop.is_set()):
        msg = consumer.poll(min(left, 0.5))
        if msg is not None:
            held.append(msg)
        tick()


def commit_courtesy(consumer: confluent_kafka.Consumer, next_offsets: Mapping[Partition, int]) -> None:
    """Tell Kafka what the database now holds (asynchronously; a failure is only logged)."""
    offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
    if not offsets:
        return
    try:
        consumer.commit(offsets=offsets, asynchronous=True)
    except confluent_kafka.KafkaException as e:
        log.info("courtesy commit to Kafka failed (the database holds the offsets): %s", e)


def note_stored(stored: dict[Partition, int], next_offsets: Mapping[Partition, int]) -> None:
    """A batch's offsets are in the database: the lag is measured from them on."""
    for partition, offset in next_offsets.items():
        if offset > stored.get(partition, -1):
            stored[partition] = offset


class Every:
    """True at most once per `seconds` (the first call included)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self._next = seconds, 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.seconds
        return True


def fetched_all(consumer: confluent_kafka.Consumer) -> bool:
    """Whether the consumer has been handed every message of its partitions, as of the last fetch.

    A wait that brings nothing can also be a fetch running late while the sink is far behind;
    this tells the two apart by the partitions' ends (cached from the last fetch response,
    no broker round trip). One message of slack: a transaction's commit marker ends a
    partition and is never handed out. An end or position not known yet counts as done.
    """
    try:
        for tp in consumer.position(consumer.assignment()):
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0 and high - tp.offset > 1:
                return False
    except confluent_kafka.KafkaException as e:
        log.debug("could not tell whether the sink has caught up: %s", e)
    return True


def report_lag(
    consumer: confluent_kafka.Consumer, stored: Mapping[Partition, int], lag: Gauge, *, paused: bool = False
) -> None:
    """Messages behind per partition: the end of the partition less what the database holds.

    Measured from the stored offsets, not the consumer's position, which runs ahead of
    them while batches are in flight or retried. While paused, a paused partition is not
    fetched, so its end is asked of the broker rather than taken from the last fetch.
    """
    try:
        for tp in consumer.assignment():
            # cached: the watermarks of the last fetch response, no broker round trip
            # (a blocking query per partition here once stalled the loop for seconds).
            low, high = consumer.get_watermark_offsets(tp, timeout=1.0, cached=not paused)
            if high < 0:
                continue
            done = max(stored.get((tp.topic, tp.partition), low), low)
            lag.labels(tp.topic, str(tp.partition)).set(max(0, high - done))
    except confluent_kafka.KafkaException as e:
        log.debug("lag not measured: %s", e)

"""Dead letters: recorded with their batch, then delivered to the dead-letter topic exactly once.

A refused record (undecodable, against the contract, or refused by PostgreSQL)
is written to `sink_dead_letters` in the same transaction as the batch and its
offsets, so a stored offset never passes a record that is neither in the
hypertables nor recorded here. After the commit the relay leases the pending
letters, produces them (headers: consumer group, source topic, partition and
offset, category, error), waits for the broker's acknowledgement and marks them
delivered. The primary key (group, topic, partition, offset) makes a re-read
record a no-op, so a restart does not repeat a dead letter. The one gap left
(delivered, but the mark not committed) is closed by looking: a letter that
was tried before is first searched for in the dead-letter topic, by its headers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import confluent_kafka
import psycopg

from shared.contract.models_deadletter import DeadLetterHeaders, dead_letter_headers
from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.settings.common import DatabaseSettings
from shared.store import deadletters
from shared.store.errors import printable

from .metrics import SinkMetrics

log = logging.getLogger(__name__)

Source = deadletters.Source  # (topic, partition, offset) of a consumed record
# Where a stored record came from: (topic, partition, offset, key, value), to dead-letter it
# if the database refuses it.
Origin = tuple[str, int, int, bytes | None, bytes | None]
# A value this large is cut in the dead letter (with a header saying so): with its headers it
# must still fit the broker's default message.max.bytes, or it could never be delivered.
MAX_DLQ_VALUE = 900_000


def unreadable(value: bytes | None, max_bytes: int) -> tuple[str, str] | None:
    """(category, reason) of a record refused before any decoder reads it: no value, or more
    bytes than the loop takes; None for one to decode."""
    if value is None:
        return ("empty", "message has no value")
    if len(value) > max_bytes:
        return ("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
    return None


@dataclass(slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    category: str  # a small fixed set, for the metric's label
    reason: str

    @property
    def source(self) -> Source:
        return (self.topic, self.partition, self.offset)

    def headers(
        self, group: str = "", failed_at: datetime | None = None
    ) -> list[tuple[str, str | bytes | None]]:
        size = len(self.value or b"")
        return dead_letter_headers(
            DeadLetterHeaders(
                consumer_group=group,
                source_topic=self.topic,
                source_partition=self.partition,
                source_offset=self.offset,
                category=self.category,
                error=printable(self.reason),
                failed_at=failed_at or datetime.now(UTC),
                value_truncated_from=size if size > MAX_DLQ_VALUE else None,
            )
        )


@dataclass(slots=True)
class _Pending:
    letter: DeadLetter
    failed_at: datetime
    attempts: int


class DeadLetterRelay:
    """Delivers the group's recorded dead letters; safe to run from several sinks of one group."""

    def __init__(
        self,
        *,
        settings: DatabaseSettings,
        producer: confluent_kafka.Producer,
        topic: str,
        group: str,
        metrics: SinkMetrics,
        reader: Callable[[], confluent_kafka.Consumer] | None = None,
        lease_s: float = 60.0,  # longer than a produce and its flush (30 s) take
        limit: int = 1000,
    ) -> None:
        self.settings, self.producer, self.topic, self.group = settings, producer, topic, group
        self.metrics, self.reader = metrics, reader
        self.lease_s, self.limit = lease_s, limit
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def deliver_pending(self) -> int:
        """Send what is recorded and not yet delivered; returns how many are now delivered.

        Never raises for a broker or database failure: what is not delivered stays
        recorded and is sent by a later call.
        """
        delivered = 0
        while True:
            try:
                pending = self._lease()
            except GpuHealthError as e:
                log.warning("dead letters not leased (retried later): %s", e)
                self.close()
                return delivered
            if not pending:
                return delivered
            tried = [p for p in pending if p.attempts > 1]
            found = self._already_delivered(tried) if tried else set()
            if found is None:  # cannot tell whether an earlier try got through: leave them for later
                self._unlease([p for p in pending])
                return delivered
            sent = self._produce([p for p in pending if p.letter.source not in found])
            done = sent | found
            try:
                self._mark(done)
            except GpuHealthError as e:
                # delivered but not marked: the next try finds them in the topic, and does not resend
                log.warning("dead letters delivered, not yet marked: %s", e)
                self.close()
                return delivered
            for p in pending:
                if p.letter.source in done:
                    self.metrics.dead_letters.labels(p.letter.category).inc()
                    log.warning(
                        "dead letter: %s",
                        printable(p.letter.reason, 500),
                        extra={
                            "topic": p.letter.topic,
                            "partition": p.letter.partition,
                            "offset": p.letter.offset,
                            "category": p.letter.category,
                        },
                    )
            delivered += len(done)
            if len(done) < len(pending):
                self._unlease([p for p in pending if p.letter.source not in done])
                return delivered
            if len(pending) < self.limit:
                return delivered

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(self.settings)
        return self._conn

    def _lease(self) -> list[_Pending]:
        leased = deadletters.lease(self._connection(), self.group, lease_s=self.lease_s, limit=self.limit)
        pending = [
            _Pending(
                DeadLetter(
                    key=d.key,
                    value=d.value,
                    topic=d.topic,
                    partition=d.partition,
                    offset=d.offset,
                    category=d.category,
                    reason=d.reason,
                ),
                failed_at=d.failed_at,
                attempts=d.attempts,
            )
            for d in leased
        ]
        return sorted(pending, key=lambda p: p.letter.source)

    def _mark(self, done: set[Source]) -> None:
        if done:
            deadletters.mark_delivered(self._connection(), self.group, done)

    def _unlease(self, pending: list[_Pending]) -> None:
        try:
            deadletters.unlease(self._connection(), self.group, [p.letter.source for p in pending])
        except GpuHealthError as e:
            log.info("dead letter leases left to expire: %s", e)
            self.close()

    def _produce(self, pending: list[_Pending]) -> set[Source]:
        sent: set[Source] = set()

        def delivery(source: Source) -> Callable[[confluent_kafka.KafkaError | None, Any], None]:
            def done(err: confluent_kafka.KafkaError | None, _: Any) -> None:
                if err is None:
                    sent.add(source)
                else:
                    log.warning("dead letter not delivered: %s", err.str())

            return done

        for p in pending:
            d = p.letter
            value = d.value[:MAX_DLQ_VALUE] if d.value is not None else None
            try:
                self.producer.produce(
                    self.topic,
                    value=value,
                    key=d.key,
                    headers=d.headers(self.group, p.failed_at),
                    on_delivery=delivery(d.source),
                )
            except (BufferError, confluent_kafka.KafkaException) as e:
                log.warning("dead letter not queued: %s", e)
                break
        self.producer.flush(30)
        return sent

    def _already_delivered(self, tried: list[_Pending]) -> set[Source] | None:
        """Which of these letters (tried before) are in the dead-letter topic; None if it cannot tell."""
        if self.reader is None:
            return set()  # nothing to look with: at least once
        wanted = {p.letter.source for p in tried}
        # A letter is produced after it was recorded; five minutes allow for clocks apart.
        since = min(p.failed_at for p in tried) - timedelta(minutes=5)
        try:
            return self._scan(wanted, int(since.timestamp() * 1000))
        except (confluent_kafka.KafkaException, GpuHealthError, KeyError) as e:
            log.warning("cannot search the dead-letter topic (retried later): %s", e)
            return None

    def _scan(self, wanted: set[Source], since_ms: int) -> set[Source]:
        assert self.reader is not None
        consumer = self.reader()
        found: set[Source] = set()
        try:
            partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            starts = consumer.offsets_for_times(
                [confluent_kafka.TopicPartition(self.topic, p, since_ms) for p in partitions], timeout=10
            )
            ends: dict[int, int] = {}
            for tp in starts:
                _, ends[tp.partition] = consumer.get_watermark_offsets(tp, timeout=10)
            todo = [tp for tp in starts if 0 <= tp.offset < ends[tp.partition]]
            consumer.assign(todo)
            left = {tp.partition for tp in todo}
            deadline = time.monotonic() + 60
            while left and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 1.0):
                    partition, offset = msg.partition(), msg.offset()
                    if msg.error() is not None or partition is None or offset is None:
                        continue
                    if offset + 1 >= ends[partition]:
                        left.discard(partition)
                    source = _source_of(msg, self.group)
                    if source in wanted:
                        found.add(source)
            if left:
                raise GpuHealthError(f"dead-letter topic not read to its end in time: {sorted(left)}")
        finally:
            consumer.close()
        return found

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _source_of(msg: confluent_kafka.Message, group: str) -> Source | None:
    """The (topic, partition, offset) a dead letter of `group` names in its headers."""
    raw: Any = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers: dict[str, bytes] = {str(k): v for k, v in pairs if isinstance(v, bytes)}
    try:
        if headers.get("dlq.consumer_group") != group.encode():
            return None
        topic = headers["dlq.source.topic"].decode()
        return (topic, int(headers["dlq.source.partition"]), int(headers["dlq.source.offset"]))
    except (KeyError, ValueError):
        return None

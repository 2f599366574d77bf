"""One consume loop for the sink's small topics: a record family's messages into its tables, each record once.

A family (verifications.py: gpu-verifications and gpu-systems; workload_rows.py:
gpu-processes and llm-sessions) says which topics it reads, how a message
becomes a record or a dead letter, and how a record is inserted. This loop
does the rest the same way for each, trading throughput for simplicity: one
consumer (its own group), one connection, one transaction per batch holding
the rows, the batch's dead letters (`sink_dead_letters`) and the next offsets
(`kafka_offsets`), then a courtesy commit to Kafka. On assignment it resumes
from the database's offsets (partitions.py). Records that break their
contract, are oversized, or that PostgreSQL refuses for a data reason
(DataRefusedError: such a record is split out under savepoints, isolate.py,
and the rest of the batch is stored) are dead letters: recorded in the batch's
transaction and delivered after the commit by DeadLetterRelay, so each is
dead-lettered exactly once and never stops the records around it. If the
database fails, the partitions are paused and the batch is retried with
backoff while the consumer keeps polling; what that polling returns is held
for the next batch, never dropped. Stopping or losing the partitions while
retrying gives the batch up unstored: it is re-read from the stored offsets.
The lag per partition is on /metrics (gpuhealth_sink_lag), as the main loop's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import confluent_kafka
import psycopg

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, DataRefusedError
from shared.settings.common import DatabaseSettings, TopicSettings
from shared.store import deadletters, offsets, samples
from shared.store.errors import translated
from shared.store.offsets import Partition

from .deadletters import DeadLetter, DeadLetterRelay, Origin
from .decode import Record
from .isolate import split_refused
from .metrics import SinkMetrics
from .partitions import (
    Every,
    commit_courtesy,
    note_stored,
    poll_paused,
    report_lag,
    resume_from_database,
)

log = logging.getLogger(__name__)

Item = tuple[str, Any, Origin]  # (the table it is counted under, the record, where it came from)
Cursor = psycopg.Cursor[Any]


class RecordBatch(Protocol):
    """A decoded batch: the records to store, the dead letters, the next offset per partition."""

    dead: list[DeadLetter]
    next_offsets: dict[Partition, int]

    def items(self) -> list[Item]: ...


class RecordFamily(Protocol):
    """The topics a records loop reads, and how their messages become rows."""

    name: str  # in logs

    def topics(self, topics: TopicSettings) -> list[str]:
        """The names of its topics: those the registry says it stores (shared/contract/topic_registry.py)."""
        ...

    def batch_of(self, messages: Sequence[Record], topics: TopicSettings, max_bytes: int) -> RecordBatch: ...

    def insert(self, cur: Cursor, table: str, record: Any) -> int:
        """Store one record (through shared.store); the rows it added to `table` (0: a replay)."""
        ...


@dataclass(slots=True)
class Written:
    rows: dict[str, int] = field(default_factory=dict)  # rows really inserted, per table
    dead_recorded: int = 0  # dead letters recorded with the batch, to deliver now


def _insert_all(
    conn: psycopg.Connection[Any], family: RecordFamily, items: list[Item], rows: dict[str, int]
) -> None:
    with conn.cursor() as cur:
        for table, record, _ in items:
            rows[table] = rows.get(table, 0) + family.insert(cur, table, record)


def write_batch(
    conn: psycopg.Connection[Any], family: RecordFamily, batch: RecordBatch, group: str
) -> Written:
    """Rows, dead letters and offsets in one transaction; DatabaseError leaves nothing behind.

    Records PostgreSQL refuses for a data reason become dead letters of the batch.
    """
    written = Written()
    items = batch.items()

    def store_part(part: list[Item]) -> DataRefusedError | None:
        rows: dict[str, int] = {}
        try:
            with conn.transaction():  # a savepoint: a refused part leaves nothing behind
                _insert_all(conn, family, part, rows)
        except DataRefusedError as e:
            return e
        for table, n in rows.items():
            written.rows[table] = written.rows.get(table, 0) + n
        return None

    with translated(conn), conn.transaction():
        refused = split_refused(items, store_part)
        if refused:
            log.warning("%s refused by the database, isolated: %s", family.name, refused[0][1])
        dead = [*batch.dead]
        for (_, _, (topic, partition, offset, key, value)), fault in refused:
            dead.append(DeadLetter(key, value, topic, partition, offset, "database", str(fault)))
        with conn.cursor() as cur:
            written.dead_recorded = deadletters.record(cur, group, dead)
            offsets.store(cur, group, batch.next_offsets)
    return written


class RecordFamilyLoop:
    """Consumes a record family's topics into its tables; `run(stop)` until `stop` is set.

    A subclass names its family (`family_type`). Constructor (keyword-only): `consumer` (its
    own group, subscribed by run);
    `dlq_producer`; `db` (read at every reconnect); `topics`; `group` (the offsets' and dead
    letters' group in the database); `metrics`; then tuning: `batch_size`, `poll_timeout_s`,
    `max_message_bytes`, `max_backoff_s`, `statement_timeout_ms`; `dlq_reader` makes a
    consumer the relay uses to check, after a failure, whether a letter already reached the
    topic; `housekeeping` is called once per poll (e.g. retention). If run() ends on an
    unexpected error, `failed` is set and so is the stop event (the whole sink stops).
    """

    family_type: ClassVar[type[RecordFamily]]

    def __init__(
        self,
        *,
        consumer: confluent_kafka.Consumer,
        dlq_producer: confluent_kafka.Producer,
        db: DatabaseSettings,
        topics: TopicSettings,
        group: str,
        metrics: SinkMetrics,
        batch_size: int = 500,
        poll_timeout_s: float = 0.5,
        max_message_bytes: int = 1_000_000,
        max_backoff_s: float = 30.0,
        statement_timeout_ms: int = 60_000,
        dlq_reader: Callable[[], confluent_kafka.Consumer] | None = None,
        housekeeping: Callable[[], None] = lambda: None,
    ) -> None:
        self.family = self.family_type()
        self.consumer, self.dlq, self.db, self.topics = consumer, dlq_producer, db, topics
        self.group, self.metrics, self.housekeeping = group, metrics, housekeeping
        self.batch_size, self.poll_timeout_s = batch_size, poll_timeout_s
        self.max_message_bytes, self.max_backoff_s = max_message_bytes, max_backoff_s
        self.statement_timeout_ms = statement_timeout_ms
        self.stop = threading.Event()  # replaced by the one run() is given: the service's
        self.generation = 0  # bumped by every rebalance
        self.failed = False  # set when run() ended on an unexpected error (the sink exits non-zero)
        self.stored: dict[Partition, int] = {}  # per partition, the next offset stored (lag from it)
        self._conn: psycopg.Connection[Any] | None = None
        self._held: list[confluent_kafka.Message] = []  # polled while backing off, not yet stored
        self.relay = DeadLetterRelay(
            settings=db,
            producer=dlq_producer,
            topic=topics.dead_letters,
            group=group,
            metrics=metrics,
            reader=dlq_reader,
        )
        self._relay_due = Every(5.0)  # dead letters recorded but not delivered (the broker was away)
        self._lag_due = Every(10.0)

    # ---------------------------------------------------------------- connection
    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop_connection()
            conn = connect(self.db)
            try:
                samples.set_statement_timeout(conn, self.statement_timeout_ms)
            except DatabaseError:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _stored_offsets(self, partitions: list[Partition]) -> dict[Partition, int]:
        try:
            return offsets.stored(self._connection(), self.group, partitions)
        except DatabaseError:
            self._drop_connection()
            raise

    # ---------------------------------------------------------------- rebalance
    def _on_assign(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self._held = []  # from the old assignment: re-read from the stored offsets
        stored = resume_from_database(
            consumer,
            partitions,
            self._stored_offsets,
            stop=self.stop,
            max_backoff_s=self.max_backoff_s,
            on_retry=self.metrics.db_retries.inc,
        )
        self.stored.update(stored)

    def _on_revoke(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self._held = []

    # ---------------------------------------------------------------- batches
    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` (the service's, from its lifecycle) is set. Never raises: an
        unexpected error sets `failed` and `stop`, so the sink it belongs to stops too."""
        self.stop = stop  # the rebalance callbacks and the retries look at it too
        try:
            self.consumer.subscribe(
                self.family.topics(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke
            )
            while not self.stop.is_set():
                messages = self.consumer.consume(self.batch_size, self.poll_timeout_s)
                if self._held:  # polled while paused: they come first, as they were fetched first
                    messages, self._held = [*self._held, *messages], []
                if messages:
                    self._store(self.family.batch_of(messages, self.topics, self.max_message_bytes))
                self.housekeeping()
                if self._relay_due.due():
                    self.relay.deliver_pending()
                self._report_lag()
            self.relay.deliver_pending()
        except Exception:
            # Not a record's fault (those are dead letters) nor the database's (retried): a bug or a
            # fatal client error. The whole sink stops, non-zero, to be restarted, rather than
            # consuming the main topics on while these are silently no longer stored.
            log.exception("the %s loop failed; stopping the sink", self.family.name)
            self.failed = True
            self.stop.set()
        finally:
            self.relay.close()
            self.dlq.flush(30)
            self._drop_connection()

    def _store(self, batch: RecordBatch) -> None:
        generation, delay, paused = self.generation, 0.5, False
        try:
            while True:
                try:
                    written = write_batch(self._connection(), self.family, batch, self.group)
                    break
                except DatabaseError as e:
                    self._drop_connection()
                    self.metrics.db_retries.inc()
                    if self.stop.is_set() or generation != self.generation:
                        # Nothing of it is stored: whoever reads the partitions next (this loop
                        # after a rebalance, or the next run) re-reads it from the stored offsets.
                        log.warning(
                            "%s batch not stored; it is re-read from the stored offsets: %s",
                            self.family.name,
                            e,
                        )
                        return
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("%s batch not stored, retrying in %.1f s: %s", self.family.name, delay, e)
                    poll_paused(
                        self.consumer, delay, self._held, lambda: self._report_lag(paused=True), self.stop
                    )
                    delay = min(delay * 2, self.max_backoff_s)
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())
        for table, n in written.rows.items():
            self.metrics.rows.labels(table).inc(n)
        note_stored(self.stored, batch.next_offsets)
        if written.dead_recorded:
            self.relay.deliver_pending()
        commit_courtesy(self.consumer, batch.next_offsets)

    def _report_lag(self, *, paused: bool = False) -> None:
        if self._lag_due.due():
            report_lag(self.consumer, self.stored, self.metrics.lag, paused=paused)

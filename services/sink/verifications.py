"""Stores gpu-verifications and gpu-systems records: a small consume loop of its own beside the main one.

The records are few (a check, an operation, a node's identity) and must never
be lost, so this loop trades throughput for simplicity: one consumer (group
``<group>-records``), one connection, one transaction per batch holding the
rows and the next offsets (``kafka_offsets``, under its own group name), then
a courtesy commit to Kafka. On assignment it resumes from the database's
offsets. Records that break their contract (shared.models_verify), whose key
is not their GPU's UUID (verifications) or their hostname (systems), that are
oversized, or that PostgreSQL refuses for a data reason (faults.py: such a
record is isolated under a savepoint, the rest of the batch is stored) are
dead letters: recorded in `sink_dead_letters` in the batch's transaction and
delivered after the commit by the same DeadLetterRelay as the main loop's, so
each is dead-lettered exactly once and never stops the records around it. If
the database fails, the partitions are paused and the batch is retried with
backoff while the consumer keeps polling; what that polling returns is held
for the next batch, never dropped. Stopping or losing the partitions while
retrying gives the batch up unstored: it is re-read from the stored offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import psycopg
from psycopg.types.json import Jsonb

from shared.chain import link_of, parse_canonical_input
from shared.config import DatabaseSettings, TopicSettings
from shared.db import connect
from shared.errors import DatabaseError, GpuHealthError
from shared.models_verify import parse_system, parse_verification, record_json

from .deadletters import DeadLetter, DeadLetterRelay, record_params, record_statement
from .decode import Record
from .faults import describe, is_data_fault
from .metrics import SinkMetrics

log = logging.getLogger(__name__)

VERIFICATION_SQL = """
INSERT INTO gpu_verifications (time, gpu_uuid, seq, kind, name, outcome, hostname, device, backend,
    device_ms, cpu_ms, speedup, prev_sha256, sha256, record, source_partition, source_offset)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (gpu_uuid, time, sha256) DO NOTHING
"""
SYSTEM_SQL = """
INSERT INTO gpu_systems (time, hostname, identity_sha256, source, gpus, record)
VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
LATEST_SQL = """
INSERT INTO gpu_systems_latest (hostname, time, identity_sha256, source, gpus, record)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (hostname) DO UPDATE SET time = EXCLUDED.time, identity_sha256 = EXCLUDED.identity_sha256,
    source = EXCLUDED.source, gpus = EXCLUDED.gpus, record = EXCLUDED.record, updated_at = now()
WHERE gpu_systems_latest.time <= EXCLUDED.time
"""
OFFSET_SQL = """
INSERT INTO kafka_offsets (consumer_group, topic, partition, next_offset) VALUES (%s, %s, %s, %s)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
SET next_offset = greatest(kafka_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()
"""


Origin = tuple[str, int, int, bytes | None, bytes | None]  # (topic, partition, offset, key, value)


@dataclass(slots=True)
class RecordBatch:
    verifications: list[tuple[Any, ...]] = field(default_factory=list)
    systems: list[tuple[Any, ...]] = field(default_factory=list)
    # parallel to verifications and systems: where each came from, to dead-letter it if refused
    verification_origins: list[Origin] = field(default_factory=list)
    system_origins: list[Origin] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(slots=True)
class RecordsWritten:
    verifications: int = 0  # rows really inserted (a replay adds none)
    systems: int = 0
    dead_recorded: int = 0  # dead letters recorded with the batch, to deliver now


def decode_records(messages: Sequence[Record], topics: TopicSettings, max_bytes: int) -> RecordBatch:
    """Rows for the two tables, and dead letters for whatever cannot be stored."""
    batch = RecordBatch()
    for msg in messages:
        if msg.error() is not None:
            continue
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        batch.next_offsets[(topic, partition)] = max(
            batch.next_offsets.get((topic, partition), 0), offset + 1
        )
        value, key = msg.value(), msg.key()
        refused: tuple[str, str] | None = None
        try:
            if value is None:
                refused = ("empty", "message has no value")
            elif len(value) > max_bytes:
                refused = ("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
            elif topic == topics.verifications:
                r = parse_verification(value)
                if key != r.gpu_uuid.encode():
                    refused = ("key", "message key does not match gpu_uuid")
                else:
                    batch.verifications.append(
                        (
                            r.time,
                            r.gpu_uuid,
                            r.seq,
                            r.kind.value,
                            r.name,
                            r.outcome.value,
                            r.hostname,
                            r.device,
                            r.backend,
                            r.device_ms,
                            r.cpu_ms,
                            r.speedup,
                            r.prev_sha256,
                            link_of(parse_canonical_input(value)),
                            Jsonb(record_json(r)),
                            partition,
                            offset,
                        )
                    )
                    batch.verification_origins.append((topic, partition, offset, key, value))
            elif topic == topics.systems:
                s = parse_system(value)
                if key != s.hostname.encode():
                    refused = ("key", "message key does not match hostname")
                else:
                    batch.systems.append(
                        (s.time, s.hostname, s.identity_sha256, s.source, len(s.gpus), Jsonb(record_json(s)))
                    )
                    batch.system_origins.append((topic, partition, offset, key, value))
            else:
                refused = ("topic", f"this loop does not read topic {topic!r}")
        except Exception as e:  # whatever a record is, it is not a crash
            refused = ("contract", str(e)[:4000])
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return batch


_Item = tuple[str, tuple[Any, ...], Origin]  # ("verification" | "system", row, origin)


def _insert(cur: psycopg.Cursor[tuple[object, ...]], items: list[_Item], written: RecordsWritten) -> None:
    for table, row, _ in items:
        if table == "verification":
            cur.execute(VERIFICATION_SQL, row)
            written.verifications += max(cur.rowcount, 0)
        else:
            cur.execute(SYSTEM_SQL, row)
            written.systems += max(cur.rowcount, 0)
            cur.execute(LATEST_SQL, row[1:2] + row[0:1] + row[2:])


def _store_isolating(
    cur: psycopg.Cursor[tuple[object, ...]], items: list[_Item], written: RecordsWritten
) -> list[DeadLetter]:
    """Insert the items; if PostgreSQL refuses one for a data reason, store the others one by one
    under savepoints, and return the refused ones as dead letters carrying the database's error."""
    cur.execute("SAVEPOINT records")
    try:
        _insert(cur, items, written)
    except Exception as e:
        if not is_data_fault(e, cur.connection):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT records")
        log.warning("record batch refused by the database, isolating the records: %s", describe(e))
    else:
        cur.execute("RELEASE SAVEPOINT records")
        return []
    written.verifications = written.systems = 0
    refused: list[DeadLetter] = []
    for item in items:
        cur.execute("SAVEPOINT record")
        one = RecordsWritten()
        try:
            _insert(cur, [item], one)
        except Exception as e:
            if not is_data_fault(e, cur.connection):
                raise
            cur.execute("ROLLBACK TO SAVEPOINT record")
            topic, partition, offset, key, value = item[2]
            refused.append(DeadLetter(key, value, topic, partition, offset, "database", describe(e)))
        else:
            written.verifications += one.verifications
            written.systems += one.systems
        cur.execute("RELEASE SAVEPOINT record")
    cur.execute("RELEASE SAVEPOINT records")
    return refused


def write_records(
    conn: psycopg.Connection[tuple[object, ...]], batch: RecordBatch, group: str
) -> RecordsWritten:
    """Rows, dead letters (sink_dead_letters) and offsets in one transaction; DatabaseError leaves
    nothing behind. Records refused for a data reason become dead letters of the batch."""
    written = RecordsWritten()
    items: list[_Item] = [
        *(
            ("verification", r, o)
            for r, o in zip(batch.verifications, batch.verification_origins, strict=True)
        ),
        *(("system", r, o) for r, o in zip(batch.systems, batch.system_origins, strict=True)),
    ]
    try:
        with conn.transaction(), conn.cursor() as cur:
            dead = [*batch.dead, *_store_isolating(cur, items, written)]
            if dead:
                cur.executemany(record_statement(), record_params(group, dead))
                written.dead_recorded = len(dead)
            for (topic, partition), next_offset in sorted(batch.next_offsets.items()):
                cur.execute(OFFSET_SQL, (group, topic, partition, next_offset))
    except psycopg.Error as e:
        raise DatabaseError(f"storing verification/system records failed: {e}") from e
    except Exception as e:  # a value psycopg could not send over a connection that broke
        raise DatabaseError(f"storing verification/system records failed ({type(e).__name__}): {e}") from e
    return written


class RecordLoop:
    def __init__(
        self,
        *,
        consumer: confluent_kafka.Consumer,
        dlq_producer: confluent_kafka.Producer,
        db: DatabaseSettings,
        topics: TopicSettings,
        group: str,
        metrics: SinkMetrics,
        max_message_bytes: int = 1_000_000,
        max_backoff_s: float = 30.0,
        dlq_reader: Callable[[], confluent_kafka.Consumer] | None = None,
    ) -> None:
        """`dlq_reader` makes a consumer the dead-letter relay uses to check, after a failure,
        whether a letter already reached the topic (see DeadLetterRelay)."""
        self.consumer, self.dlq, self.db, self.topics = consumer, dlq_producer, db, topics
        self.group, self.metrics = group, metrics
        self.max_message_bytes, self.max_backoff_s = max_message_bytes, max_backoff_s
        self.stop = threading.Event()
        self.generation = 0
        self.failed = False  # set when run() ended on an unexpected error (the sink exits non-zero)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._held: list[confluent_kafka.Message] = []  # polled while backing off, not yet stored
        self.relay = DeadLetterRelay(
            settings=db, producer=dlq_producer, topic=topics.dlq, group=group, metrics=metrics,
            reader=dlq_reader,
        )  # fmt: skip
        self._next_relay = 0.0

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop_connection()
            self._conn = connect(self.db)
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _stored_offsets(self, partitions: list[confluent_kafka.TopicPartition]) -> dict[tuple[str, int], int]:
        rows = (
            self._connection()
            .execute(
                "SELECT topic, partition, next_offset FROM kafka_offsets WHERE consumer_group = %s",
                (self.group,),
            )
            .fetchall()
        )
        self._connection().commit()
        return {(str(t), int(str(p))): int(str(o)) for t, p, o in rows}

    def _on_assign(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self._held = []  # from the old assignment: re-read from the stored offsets
        delay = 0.5
        while True:
            try:
                stored = self._stored_offsets(partitions)
                break
            except (psycopg.Error, GpuHealthError) as e:
                self._drop_connection()
                self.metrics.db_retries.inc()
                if self.stop.is_set():
                    stored = {}
                    break
                log.warning("cannot read stored offsets, retrying in %.1f s: %s", delay, e)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        for p in partitions:
            p.offset = stored.get((p.topic, p.partition), confluent_kafka.OFFSET_BEGINNING)
        consumer.assign(partitions)

    def _on_revoke(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self._held = []

    def run(self, stop: threading.Event | None = None) -> None:
        """Store until `stop` (the service's, given by its lifecycle) is set; a failure sets it."""
        if stop is not None:
            self.stop = stop
        self.consumer.subscribe(
            [self.topics.verifications, self.topics.systems],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        try:
            while not self.stop.is_set():
                messages = self.consumer.consume(500, 0.5)
                if self._held:  # polled while paused: they come first, as they were fetched first
                    messages, self._held = [*self._held, *messages], []
                if messages:
                    self._store(decode_records(messages, self.topics, self.max_message_bytes))
                self._relay_now_and_then()
            self.relay.deliver_pending()
        except Exception:
            # Not a record's fault (those are dead letters) nor the database's (retried): a bug or a
            # fatal client error. The whole sink stops, non-zero, to be restarted, rather than
            # consuming the main topics on while these two are silently no longer stored.
            log.exception("the records loop failed; stopping the sink")
            self.failed = True
            self.stop.set()
        finally:
            self.relay.close()
            self.dlq.flush(30)
            self._drop_connection()

    def _relay_now_and_then(self, every_s: float = 5.0) -> None:
        """Dead letters recorded but not delivered (the broker was away) are sent again."""
        now = time.monotonic()
        if now >= self._next_relay:
            self._next_relay = now + every_s
            self.relay.deliver_pending()

    def _store(self, batch: RecordBatch) -> None:
        generation, delay, paused = self.generation, 0.5, False
        try:
            while True:
                try:
                    written = write_records(self._connection(), batch, self.group)
                    break
                except (psycopg.Error, GpuHealthError) as e:
                    self._drop_connection()
                    self.metrics.db_retries.inc()
                    if self.stop.is_set() or generation != self.generation:
                        # Nothing of it is stored: whoever reads the partitions next (this loop
                        # after a rebalance, or the next run) re-reads it from the stored offsets.
                        log.warning("record batch not stored; it is re-read from the stored offsets: %s", e)
                        return
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("record batch not stored, retrying in %.1f s: %s", delay, e)
                    self._wait(delay)
                    delay = min(delay * 2, self.max_backoff_s)
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())
        self.metrics.rows.labels("gpu_verifications").inc(written.verifications)
        self.metrics.rows.labels("gpu_systems").inc(written.systems)
        if written.dead_recorded:
            self.relay.deliver_pending()
        offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except confluent_kafka.KafkaException as e:
                log.info("courtesy commit failed (the database holds the offsets): %s", e)

    def _wait(self, seconds: float) -> None:
        """Back off while polling the paused consumer (it keeps its place in the group); whatever
        the poll returns was fetched before the pause and is held for the next batch."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = self.consumer.poll(min(left, 0.5))
            if msg is not None:
                self._held.append(msg)

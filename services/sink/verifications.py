"""Stores gpu-verifications and gpu-systems records: a small consume loop of its own beside the main one.

The records are few (a check, an operation, a node's identity) and must never
be lost, so this loop trades throughput for simplicity: one consumer (group
``<group>-records``), one connection, one transaction per batch holding the
rows and the next offsets (``kafka_offsets``, under its own group name), then
a courtesy commit to Kafka. On assignment it resumes from the database's
offsets. Records that break their contract (shared.models_verify), whose key
is not their GPU's UUID (verifications) or their hostname (systems), or that
are oversized go to the dead-letter topic with the same headers as the main
loop's, and never stop the records around them. If the database fails, the
partitions are paused and the batch is retried with backoff while the
consumer keeps polling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import psycopg
from psycopg.types.json import Jsonb

from shared.chain import link_of, parse_canonical_input
from shared.config import DatabaseSettings, TopicSettings
from shared.db import connect
from shared.errors import DatabaseError, GpuHealthError, KafkaProduceError
from shared.models_verify import parse_system, parse_verification, record_json

from .deadletters import DeadLetter
from .decode import Record
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


@dataclass(slots=True)
class RecordBatch:
    verifications: list[tuple[Any, ...]] = field(default_factory=list)
    systems: list[tuple[Any, ...]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


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
            elif topic == topics.systems:
                s = parse_system(value)
                if key != s.hostname.encode():
                    refused = ("key", "message key does not match hostname")
                else:
                    batch.systems.append(
                        (s.time, s.hostname, s.identity_sha256, s.source, len(s.gpus), Jsonb(record_json(s)))
                    )
            else:
                refused = ("topic", f"this loop does not read topic {topic!r}")
        except Exception as e:  # whatever a record is, it is not a crash
            refused = ("contract", str(e)[:4000])
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return batch


def write_records(conn: psycopg.Connection[tuple[object, ...]], batch: RecordBatch, group: str) -> int:
    """Rows and offsets in one transaction; returns the verification rows really inserted."""
    inserted = 0
    try:
        with conn.transaction(), conn.cursor() as cur:
            for row in batch.verifications:
                cur.execute(VERIFICATION_SQL, row)
                inserted += max(cur.rowcount, 0)
            for row in batch.systems:
                cur.execute(SYSTEM_SQL, row)
                cur.execute(LATEST_SQL, row[1:2] + row[0:1] + row[2:])
            for (topic, partition), next_offset in batch.next_offsets.items():
                cur.execute(OFFSET_SQL, (group, topic, partition, next_offset))
    except psycopg.Error as e:
        raise DatabaseError(f"storing verification/system records failed: {e}") from e
    return inserted


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
    ) -> None:
        self.consumer, self.dlq, self.db, self.topics = consumer, dlq_producer, db, topics
        self.group, self.metrics = group, metrics
        self.max_message_bytes, self.max_backoff_s = max_message_bytes, max_backoff_s
        self.stop = threading.Event()
        self.generation = 0
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.db)
        return self._conn

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
        delay = 0.5
        while True:
            try:
                stored = self._stored_offsets(partitions)
                break
            except (psycopg.Error, GpuHealthError) as e:
                self._conn = None
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

    def run(self) -> None:
        self.consumer.subscribe(
            [self.topics.verifications, self.topics.systems],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        try:
            while not self.stop.is_set():
                messages = self.consumer.consume(500, 0.5)
                if messages:
                    self._store(decode_records(messages, self.topics, self.max_message_bytes))
        finally:
            self.dlq.flush(30)
            if self._conn is not None:
                self._conn.close()

    def _store(self, batch: RecordBatch) -> None:
        generation, delay, paused = self.generation, 0.5, False
        try:
            while True:
                try:
                    self._deliver(batch.dead)
                    batch.dead = []
                    inserted = write_records(self._connection(), batch, self.group)
                    break
                except (DatabaseError, KafkaProduceError, GpuHealthError, psycopg.Error) as e:
                    self._conn = None
                    self.metrics.db_retries.inc()
                    if self.stop.is_set() or generation != self.generation:
                        log.warning("record batch not stored; it is re-read from the stored offsets: %s", e)
                        return
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("record batch not stored, retrying in %.1f s: %s", delay, e)
                    deadline = time.monotonic() + delay
                    while (left := deadline - time.monotonic()) > 0:
                        self.consumer.poll(min(left, 0.5))
                    delay = min(delay * 2, self.max_backoff_s)
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())
        self.metrics.rows.labels("gpu_verifications").inc(inserted)
        self.metrics.rows.labels("gpu_systems").inc(len(batch.systems))
        offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except confluent_kafka.KafkaException as e:
                log.info("courtesy commit failed (the database holds the offsets): %s", e)

    def _deliver(self, dead: list[DeadLetter]) -> None:
        if not dead:
            return
        failures: list[str] = []
        for letter in dead:
            self.dlq.produce(
                self.topics.dlq,
                value=letter.value,
                key=letter.key,
                headers=letter.headers(),
                on_delivery=lambda err, _: failures.append(err.str()) if err is not None else None,
            )
        if self.dlq.flush(30) or failures:
            raise KafkaProduceError(
                f"dead letters not delivered: {failures[:1] or 'timeout'}", retriable=True
            )
        for letter in dead:
            self.metrics.dead_letters.labels(letter.category).inc()
            log.warning(
                "dead letter: %s", letter.reason, extra={"topic": letter.topic, "offset": letter.offset}
            )

"""The sink's workload lane: gpu-processes and llm-sessions into TimescaleDB, beside the metrics loop.

It has its own consumer group (`<sink group>-workload`) and its own thread, so
neither lane waits on the other. Per batch: decode; deliver dead letters and
wait for the broker's ack; write rows and offsets in one transaction; commit
offsets to Kafka as a courtesy. Offsets live in the database: on assignment a
partition resumes from there. A database failure pauses the partitions and
retries the same batch with backoff while polling; a rebalance meanwhile drops
the batch (its records are still in Kafka for whoever owns them now). Old
chunks are dropped on a timer (KEEP_DAYS), under either TimescaleDB license.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import confluent_kafka
from prometheus_client import CollectorRegistry, Counter

from shared.config import Settings, TopicSettings
from shared.errors import DatabaseError, KafkaProduceError
from shared.kafka import make_consumer, make_producer

from .deadletters import DeadLetter
from .workload_rows import WorkloadBatch, WorkloadWriter, decode_workload

log = logging.getLogger(__name__)

# Days kept per table: process listings are operational detail; LLM figures feed capacity planning.
KEEP_DAYS = {"gpu_processes": 30, "gpu_process_polls": 30, "llm_sessions": 90, "llm_server_status": 90}


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


class WorkloadSink:
    def __init__(
        self,
        *,
        consumer: confluent_kafka.Consumer,
        dlq_producer: confluent_kafka.Producer,
        writer: WorkloadWriter,
        topics: TopicSettings,
        registry: CollectorRegistry,
        stop: threading.Event,
        batch_size: int = 5000,
        poll_timeout_s: float = 0.5,
        max_message_bytes: int = 1_000_000,
        max_backoff_s: float = 30.0,
        keep_days: dict[str, int] | None = None,
        retention_interval_s: float = 600.0,
    ) -> None:
        self.consumer, self.dlq, self.writer, self.topics = consumer, dlq_producer, writer, topics
        self.stop, self.batch_size, self.poll_timeout_s = stop, batch_size, poll_timeout_s
        self.max_message_bytes, self.max_backoff_s = max_message_bytes, max_backoff_s
        self.generation = 0
        self.keep_days = KEEP_DAYS if keep_days is None else keep_days
        self.retention_interval_s, self._next_retention = retention_interval_s, 0.0
        p = "gpuhealth_sink_workload_"
        self.rows = Counter(
            p + "rows_written",
            "Workload rows inserted (polls, sessions, server snapshots)",
            registry=registry,
        )
        self.dead_letters = Counter(
            p + "dead_letters", "Workload records sent to the DLQ", ["category"], registry=registry
        )
        self.db_retries = Counter(p + "db_retries", "Workload batch writes retried", registry=registry)
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, *, group_id: str, registry: CollectorRegistry, stop: threading.Event
    ) -> WorkloadSink:
        group = f"{group_id}-workload"
        return cls(
            consumer=make_consumer(settings.kafka, group_id=group),
            dlq_producer=make_producer(settings.kafka),
            writer=WorkloadWriter(settings.db, group=group),
            topics=settings.topics,
            registry=registry,
            stop=stop,
        )

    def _on_assign(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        delay = 0.5
        while True:
            try:
                stored = self.writer.stored_offsets([(p.topic, p.partition) for p in partitions])
                break
            except DatabaseError as e:
                if self.stop.is_set():
                    stored = {}
                    break
                log.warning("workload sink cannot read stored offsets, retrying in %.1f s: %s", delay, e)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        for p in partitions:
            p.offset = stored.get((p.topic, p.partition), confluent_kafka.OFFSET_BEGINNING)
        consumer.assign(partitions)

    def retention(self) -> None:
        """Drop old chunks, at most every `retention_interval_s`; a failure waits for the next round."""
        if (now := time.monotonic()) < self._next_retention:
            return
        self._next_retention = now + self.retention_interval_s
        try:
            dropped = self.writer.drop_old_chunks(self.keep_days)
        except DatabaseError as e:
            log.warning("workload retention skipped this round: %s", e)
            return
        if any(dropped.values()):
            log.info("workload retention dropped chunks", extra={"dropped": dropped})

    def _on_revoke(self, _: confluent_kafka.Consumer, __: list[confluent_kafka.TopicPartition]) -> None:
        self.generation += 1

    def run(self) -> None:
        self.consumer.subscribe(
            [self.topics.processes, self.topics.llm_sessions],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        try:
            while not self.stop.is_set():
                messages = self.consumer.consume(self.batch_size, self.poll_timeout_s)
                if messages:
                    self._store(
                        decode_workload(messages, self.topics, self.max_message_bytes), self.generation
                    )
                self.retention()
        finally:
            self.dlq.flush(30)
            self.consumer.close()
            self.writer.close()

    def _store(self, batch: WorkloadBatch, generation: int) -> None:
        delay, paused = 0.5, False
        try:
            while True:
                try:
                    if batch.dead:
                        self._deliver(batch.dead)
                        batch.dead = []
                    self.rows.inc(self.writer.write(batch))
                    break
                except (DatabaseError, KafkaProduceError) as e:
                    if self.generation != generation or self.stop.is_set():
                        log.warning(
                            "workload batch not stored (%s); it is re-read from the stored offsets", e
                        )
                        return
                    self.db_retries.inc()
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("workload batch not stored, retrying in %.1f s: %s", delay, e)
                    deadline = time.monotonic() + delay
                    while (left := deadline - time.monotonic()) > 0 and not self.stop.is_set():
                        self.consumer.poll(min(left, 0.5))
                    delay = min(delay * 2, self.max_backoff_s)
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())
        offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except confluent_kafka.KafkaException as e:
                log.info("courtesy commit to Kafka failed (the database holds the offsets): %s", e)

    def _deliver(self, dead: list[DeadLetter]) -> None:
        deliver_dead_letters(self.dlq, self.topics.dlq, dead)
        for letter in dead:
            self.dead_letters.labels(letter.category).inc()

    def start(self) -> WorkloadSink:
        self._thread = threading.Thread(target=self.run, name="sink-workload", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float = 60.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

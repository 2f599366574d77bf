"""The sink's consume loop: batches in, one transaction each, offsets from the database.

Order per batch: decode; deliver dead letters (and wait for the broker's ack);
write rows + offsets in one transaction; then commit offsets to Kafka as a
courtesy (so `kafka-consumer-groups` shows lag). If the database fails, the
assigned partitions are paused and the same batch is retried with backoff
while the consumer keeps polling, so it stays in its group
(max.poll.interval.ms). If a rebalance takes partitions away meanwhile, the
batch is dropped: its records are still in Kafka, and whoever owns the
partitions now resumes from the offsets stored in the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import confluent_kafka

from shared.config import TopicSettings
from shared.errors import DatabaseError, KafkaProduceError

from .dead_letters import deliver_dead_letters
from .decode import DeadLetter, Decoded, decode
from .metrics import SinkMetrics
from .writer import BatchWriter, EarlierBatchError, WriteResult

log = logging.getLogger(__name__)

DEPTH = 2  # batches in flight per lane


class SinkLoop:
    def __init__(
        self,
        *,
        consumer: confluent_kafka.Consumer,
        dlq_producer: confluent_kafka.Producer,
        writer: BatchWriter,
        topics: TopicSettings,
        metrics: SinkMetrics,
        batch_size: int = 20_000,
        poll_timeout_s: float = 0.5,
        max_message_bytes: int = 1_000_000,
        max_backoff_s: float = 30.0,
        housekeeping: Callable[[], None] = lambda: None,
    ) -> None:
        self.consumer, self.dlq, self.writer = consumer, dlq_producer, writer
        self.topics, self.metrics = topics, metrics
        self.batch_size, self.poll_timeout_s = batch_size, poll_timeout_s
        self.max_message_bytes, self.max_backoff_s = max_message_bytes, max_backoff_s
        self.housekeeping = housekeeping
        self.generation = 0  # bumped by every rebalance
        # Partitions this loop has owned, set from its own thread's rebalance callbacks;
        # other threads read this rather than calling into the consumer.
        self.owned: set[tuple[str, int]] = set()
        self.ever_owned: set[tuple[str, int]] = set()
        self.stop = threading.Event()
        self._last_lag = 0.0
        # Partition lanes, each with up to DEPTH batches in flight: one running its statements,
        # the next being staged. The writer has a connection for each.
        self.lanes = max(1, writer.connections // DEPTH)
        self._executor = ThreadPoolExecutor(max_workers=writer.connections, thread_name_prefix="sink-writer")

    # ---------------------------------------------------------------- rebalance
    def subscribe(self) -> None:
        self.consumer.subscribe(
            [self.topics.metrics_raw, self.topics.events],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )

    def _on_assign(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        delay = 0.5
        while True:
            try:
                stored = self.writer.stored_offsets((p.topic, p.partition) for p in partitions)
                break
            except DatabaseError as e:
                if self.stop.is_set():
                    stored = {}
                    break
                log.warning("cannot read stored offsets, retrying in %.1f s: %s", delay, e)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        for p in partitions:
            # The database is the truth: a partition it has never seen starts at the beginning.
            p.offset = stored.get((p.topic, p.partition), confluent_kafka.OFFSET_BEGINNING)
        consumer.assign(partitions)
        self.owned = {(p.topic, p.partition) for p in partitions}
        self.ever_owned |= self.owned
        self.metrics.assigned.set(len(self.owned))
        log.info(
            "partitions assigned",
            extra={"partitions": [f"{p.topic}[{p.partition}]@{p.offset}" for p in partitions]},
        )

    def _on_revoke(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self.owned = set()
        self.metrics.assigned.set(0)
        log.info(
            "partitions revoked",
            extra={"partitions": [f"{p.topic}[{p.partition}]" for p in partitions]},
        )

    # ---------------------------------------------------------------- batches
    def run(self) -> None:
        """Consume until `stop` is set; the batches in flight are finished first.

        The stages overlap. Each consumed batch is split into lanes by partition. A
        lane's batches commit one after another, in order, while the next one is
        already being staged; the lanes write side by side (a GPU's rows are all in
        one partition, so they never touch the same rows). Meanwhile this thread
        consumes and decodes what comes next: psycopg waits for PostgreSQL without
        the GIL. The consumer is only ever touched from this thread.
        """
        self.subscribe()
        in_flight: dict[int, deque[tuple[Decoded, Future[WriteResult]]]] = {}
        try:
            while not self.stop.is_set():
                messages = self.consumer.consume(self.batch_size, self.poll_timeout_s)
                lanes = self._decode(messages) if messages else {}
                # Finish what is done (everything, when idle), and make room in busy lanes.
                for lane, queue in in_flight.items():
                    while queue and (
                        not lanes or queue[0][1].done() or (lane in lanes and len(queue) >= DEPTH)
                    ):
                        self._complete(*queue.popleft())
                for lane, decoded in lanes.items():
                    queue = in_flight.setdefault(lane, deque())
                    previous = queue[-1][1] if queue else None
                    queue.append((decoded, self._start(decoded, previous)))
                self.housekeeping()
                self._report_lag()
            for queue in in_flight.values():
                while queue:
                    self._complete(*queue.popleft())
        finally:
            self._executor.shutdown(wait=True)
            self.dlq.flush(30)

    def _decode(self, messages: list[confluent_kafka.Message]) -> dict[int, Decoded]:
        lanes = decode(messages, self.topics, self.max_message_bytes, self.lanes)
        started = time.perf_counter()
        for decoded in lanes.values():
            decoded.generation, decoded.started = self.generation, started
            self.metrics.consumed.inc(decoded.consumed)
        return lanes

    def _start(self, decoded: Decoded, previous: Future[WriteResult] | None = None) -> Future[WriteResult]:
        """Dead letters first (they must be safe before their offsets are), then the write.

        The write commits only once `previous` (the batch before it) is stored.
        """
        if decoded.dead:
            try:
                self._deliver(decoded.dead)
                decoded.dead = []
            except KafkaProduceError as e:
                failed: Future[WriteResult] = Future()
                failed.set_exception(e)
                return failed
        after = previous.result if previous is not None else None
        return self._executor.submit(self.writer.write, decoded.batch, after)

    def _complete(self, decoded: Decoded, future: Future[WriteResult]) -> bool:
        """Wait for a batch's write, retrying with backoff; False if it had to be given up."""
        try:
            result = future.result()
        except (DatabaseError, KafkaProduceError) as e:
            retried = self._retry(decoded, e)
            if retried is None:
                return False
            result = retried
        self._commit_courtesy(decoded)
        self._count(decoded, result.metrics_inserted, result.events_inserted)
        self.metrics.batch_seconds.observe(time.perf_counter() - decoded.started)
        return True

    def _retry(self, decoded: Decoded, first: Exception) -> WriteResult | None:
        error: Exception = first
        delay, paused = 0.5, False
        # Held back only because the batch before it failed (stored by now): go again at once.
        back_off = not isinstance(first, EarlierBatchError)
        try:
            while True:
                if self.generation != decoded.generation:
                    self.metrics.abandoned.inc()
                    log.warning(
                        "partitions moved while the batch waited; the new owner resumes from the database"
                    )
                    return None
                if back_off:
                    self.metrics.db_retries.inc()
                    if self.stop.is_set() and delay > 0.5:
                        # Stopping while the database is away: nothing of this batch is stored,
                        # so the next run re-reads it from the offsets in the database.
                        log.warning("stopping with an unstored batch; it will be re-read on restart")
                        return None
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("batch not stored, retrying in %.1f s: %s", delay, error)
                    self._wait(delay)
                    delay = min(delay * 2, self.max_backoff_s)
                back_off = True
                try:
                    return self._start(decoded).result()
                except (DatabaseError, KafkaProduceError) as e:
                    error = e
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())

    def _wait(self, seconds: float) -> None:
        """Back off while polling the (paused) consumer, so it keeps its place in the group."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.consumer.poll(min(left, 0.5))

    def _deliver(self, dead: list[DeadLetter]) -> None:
        deliver_dead_letters(self.dlq, self.topics.dlq, dead)
        for letter in dead:
            self.metrics.dead_letters.labels(letter.category).inc()

    def _commit_courtesy(self, decoded: Decoded) -> None:
        offsets = [
            confluent_kafka.TopicPartition(t, p, o) for (t, p), o in decoded.batch.next_offsets.items()
        ]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except confluent_kafka.KafkaException as e:
            log.info("courtesy commit to Kafka failed (the database holds the offsets): %s", e)

    def _count(self, decoded: Decoded, metrics_in: int, events_in: int) -> None:
        batch = decoded.batch
        self.metrics.batches.inc()
        self.metrics.rows.labels("gpu_metrics").inc(metrics_in)
        self.metrics.rows.labels("gpu_events").inc(events_in)
        self.metrics.duplicates.labels("gpu_metrics").inc(len(batch.rows) - metrics_in)
        self.metrics.duplicates.labels("gpu_events").inc(len(batch.events) - events_in)

    def _report_lag(self, every_s: float = 10.0) -> None:
        now = time.monotonic()
        if now - self._last_lag < every_s:
            return
        self._last_lag = now
        try:
            for tp in self.consumer.position(self.consumer.assignment()):
                # cached: the high watermark from the last fetch response, no broker round trip
                # (a blocking query per partition here once stalled the loop for seconds).
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self.metrics.lag.labels(tp.topic, str(tp.partition)).set(high - tp.offset)
        except confluent_kafka.KafkaException as e:
            log.debug("lag not measured: %s", e)

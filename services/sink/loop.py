"""The sink's consume loop: batches in, one transaction each, offsets from the database.

Order per batch: decode; write rows, dead letters and offsets in one
transaction; deliver the dead letters (deadletters.py); then commit offsets to
Kafka as a courtesy (so `kafka-consumer-groups` shows lag). If the database
fails (a connection or server failure: data faults are isolated by the
writer), the assigned partitions are paused and the same batch is retried with
backoff while the consumer keeps polling, so it stays in its group
(max.poll.interval.ms). If a rebalance takes partitions away meanwhile, or the
sink is told to stop, the batch is given up, and so is every later batch of
its lane from the same assignment: nothing is ever stored after a batch that
was not, so the stored offsets never pass an unstored record. The records are
still in Kafka; whoever owns the partitions next resumes from the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import confluent_kafka

from shared.plumbing.errors import DatabaseError
from shared.settings.common import TopicSettings

from .deadletters import DeadLetterRelay
from .decode import Decoded, decode_lanes
from .metrics import SinkMetrics
from .partitions import (
    Every,
    commit_courtesy,
    fetched_all,
    note_stored,
    poll_paused,
    report_lag,
    resume_from_database,
)
from .rollup import RollupRefresher
from .writer import BatchWriter, EarlierBatchError, WriteResult

log = logging.getLogger(__name__)

DEPTH = 2  # batches in flight per lane
# While writes are in flight, the consumer waits for messages in steps this long (at most), so
# a batch that finished while the topic went quiet is completed (offsets, metrics, the rollup
# told) within one step rather than one whole poll timeout later.
IN_FLIGHT_POLL_S = 0.05


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
        dlq_reader: Callable[[], confluent_kafka.Consumer] | None = None,
        rollup: RollupRefresher | None = None,
    ) -> None:
        """`dlq_reader` makes a consumer (no group needed) that the dead-letter relay uses to
        check, after a failure, whether a letter already reached the topic."""
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
        self.stop = threading.Event()  # replaced by the one run() is given: the service's
        self._lag_due = Every(10.0)
        self._caught_up = True  # the last consume found the topic dry (a wait that brought nothing)
        # Per partition, the next offset known stored in the database (the lag is measured from it).
        self.stored: dict[tuple[str, int], int] = {}
        self.relay = DeadLetterRelay(
            settings=writer.settings,
            producer=dlq_producer,
            topic=topics.dead_letters,
            group=writer.group,
            metrics=metrics,
            reader=dlq_reader,
        )
        self._relay_due = Every(5.0)  # dead letters recorded but not delivered (the broker was away)
        self._held: list[confluent_kafka.Message] = []  # polled while backing off, not yet batched
        self._given_up: dict[int, int] = {}  # lane -> the newest generation it gave a batch up in
        # Partition lanes, each with up to DEPTH batches in flight: one running its statements,
        # the next being staged. The writer has a connection for each.
        self.lanes = max(1, writer.connections // DEPTH)
        self._executor = ThreadPoolExecutor(max_workers=writer.connections, thread_name_prefix="sink-writer")
        # The 1-minute rollup is refreshed after the batches, in a thread of its own (rollup.py).
        self.rollup = (
            rollup
            if rollup is not None
            else RollupRefresher(writer.settings, metrics, complete_for=(writer.group, topics.metrics_raw))
        )

    # ---------------------------------------------------------------- rebalance
    def subscribe(self) -> None:
        self.consumer.subscribe(
            self.topics.stored_by("metrics"),  # gpu-metrics-raw and gpu-events (the topic registry)
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )

    def _on_assign(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.generation += 1
        self._held = []  # from the old assignment: re-read from the stored offsets
        stored = resume_from_database(
            consumer, partitions, self.writer.stored_offsets, stop=self.stop, max_backoff_s=self.max_backoff_s
        )
        self.stored.update(stored)
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
        self._held = []
        self.owned = set()
        self.metrics.assigned.set(0)
        log.info(
            "partitions revoked",
            extra={"partitions": [f"{p.topic}[{p.partition}]" for p in partitions]},
        )

    # ---------------------------------------------------------------- batches
    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` (the service's, from its lifecycle) is set; batches in flight are finished.

        The stages overlap. Each consumed batch is split into lanes by partition. A
        lane's batches commit one after another, in order, while the next one is
        already being staged; the lanes write side by side (a GPU's rows are all in
        one partition, so they never touch the same rows). Meanwhile this thread
        consumes and decodes what comes next: psycopg waits for PostgreSQL without
        the GIL. The consumer is only ever touched from this thread.
        """
        self.stop = stop  # the rebalance callbacks and the retries look at it too
        self.subscribe()
        in_flight: dict[int, deque[tuple[Decoded, Future[WriteResult]]]] = {}
        self.rollup.start()
        try:
            while not self.stop.is_set():
                messages = self._consume(in_flight)
                lanes = self._decode(messages) if messages else {}
                # Finish what is done (everything, when idle), and make room in busy lanes.
                for lane, queue in in_flight.items():
                    while queue and (
                        not lanes or queue[0][1].done() or (lane in lanes and len(queue) >= DEPTH)
                    ):
                        self._finish(lane, queue)
                for lane, decoded in lanes.items():
                    if decoded.generation <= self._given_up.get(lane, -1):
                        self._give_up(decoded)  # consumed after a batch that was given up
                        continue
                    queue = in_flight.setdefault(lane, deque())
                    previous = queue[-1][1] if queue else None
                    queue.append((decoded, self._start(decoded, previous)))
                self.housekeeping()
                if self._relay_due.due():
                    self.relay.deliver_pending()
                self._report_lag()
            for lane, queue in in_flight.items():
                while queue:
                    self._finish(lane, queue)
            self.relay.deliver_pending()
        finally:
            self._executor.shutdown(wait=True)
            self.rollup.close()
            self.relay.close()
            self.dlq.flush(30)

    def _consume(
        self, in_flight: dict[int, deque[tuple[Decoded, Future[WriteResult]]]]
    ) -> list[confluent_kafka.Message]:
        """Up to a batch of messages, waiting at most the poll timeout for it to fill.

        While writes are in flight the wait is cut into short steps, and between them
        the writes that finished are completed: the topic has run dry (the sink has
        caught up), so their rollup refresh is not held back by the wait. Messages polled
        while paused (a retry's backoff) keep their place: they were fetched before
        whatever is consumed after them.
        """
        deadline = time.monotonic() + self.poll_timeout_s
        messages, self._held = self._held, []
        generation = self.generation
        while len(messages) < self.batch_size:
            wait = deadline - time.monotonic()
            if any(in_flight.values()):
                wait = min(wait, IN_FLIGHT_POLL_S)
            more = self.consumer.consume(self.batch_size - len(messages), max(wait, 0.0))
            # Caught up: nothing came, none is in hand, and nothing is left to fetch (not merely
            # a slow fetch).
            self._caught_up = not more and not messages and fetched_all(self.consumer)
            if self.generation != generation:  # a rebalance: the new owner resumes from the database
                messages, generation = [], self.generation
            messages += more
            if len(messages) >= self.batch_size:
                break
            for lane, queue in in_flight.items():
                while queue and queue[0][1].done():
                    self._finish(lane, queue)  # a retry in it may poll (held) and see a rebalance
            if self._caught_up and not any(in_flight.values()):
                # all stored: the rollup need not wait for this sink's partitions any more
                self.rollup.caught_up(self._own_samples())
            if self.generation != generation:
                messages, generation = [], self.generation
            messages, self._held = [*messages, *self._held], []
            if time.monotonic() >= deadline:
                break
        return messages

    def _own_samples(self) -> list[tuple[str, int]]:
        """The samples' partitions this loop holds."""
        return [p for p in self.owned if p[0] == self.topics.metrics_raw]

    def _finish(self, lane: int, queue: deque[tuple[Decoded, Future[WriteResult]]]) -> None:
        """Complete the lane's oldest batch; if it was given up, give up the ones after it too.

        They were consumed after it, so storing one would move the offsets over its records;
        so are the lane's batches consumed later from the same assignment (stop or rebalance
        follows a give-up, and a new assignment starts again from the stored offsets).
        """
        decoded, future = queue.popleft()
        if self._complete(decoded, future):
            return
        self._given_up[lane] = max(self._given_up.get(lane, -1), decoded.generation)
        while queue and queue[0][0].generation <= decoded.generation:
            later, pending = queue.popleft()
            try:
                pending.result()  # it waits for the given-up one, so it fails and stores nothing
            except DatabaseError:
                pass
            else:  # pragma: no cover - a write never commits after the batch before it failed
                log.error("a batch after one given up was stored")
            self._give_up(later)

    def _give_up(self, decoded: Decoded) -> None:
        self.metrics.abandoned.inc()
        log.warning("batch given up: one before it in its lane was", extra={"records": decoded.consumed})

    def _decode(self, messages: list[confluent_kafka.Message]) -> dict[int, Decoded]:
        lanes = decode_lanes(messages, self.topics, self.max_message_bytes, self.lanes)
        started = time.perf_counter()
        for decoded in lanes.values():
            decoded.generation, decoded.started = self.generation, started
            self.metrics.consumed.inc(decoded.consumed)
        return lanes

    def _start(self, decoded: Decoded, previous: Future[WriteResult] | None = None) -> Future[WriteResult]:
        """Submit the batch's write; it commits only once `previous` (the batch before it) is stored."""
        after = previous.result if previous is not None else None
        return self._executor.submit(self.writer.write, decoded.batch, after)

    def _complete(self, decoded: Decoded, future: Future[WriteResult]) -> bool:
        """Wait for a batch's write, retrying with backoff; False if it had to be given up."""
        try:
            result = future.result()
        except DatabaseError as e:
            retried = self._retry(decoded, e)
            if retried is None:
                return False
            result = retried
        note_stored(self.stored, decoded.batch.next_offsets)
        if result.dead_recorded:
            self.relay.deliver_pending()
        commit_courtesy(self.consumer, decoded.batch.next_offsets)
        self._count(decoded, result)
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
                if self.stop.is_set():
                    # Stopping while the database is away or a statement hangs (cancelled at stop),
                    # or after the batch before it was given up so: no new attempt. Nothing of this
                    # batch is stored, so the next run re-reads it from the offsets in the database.
                    log.warning("stopping with an unstored batch; it will be re-read on restart")
                    return None
                if back_off:
                    self.metrics.db_retries.inc()
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    log.error("batch not stored, retrying in %.1f s: %s", delay, error)
                    self._wait(delay)
                    delay = min(delay * 2, self.max_backoff_s)
                back_off = True
                try:
                    return self._start(decoded).result()
                except DatabaseError as e:
                    error = e
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())

    def _wait(self, seconds: float) -> None:
        """Back off while polling the (paused) consumer, holding what it returns (partitions.poll_paused);
        cut short by `stop`: a backoff grown to `max_backoff_s` would otherwise be waited out at stop."""
        poll_paused(self.consumer, seconds, self._held, lambda: self._report_lag(paused=True), self.stop)

    def _count(self, decoded: Decoded, result: WriteResult) -> None:
        batch = decoded.batch
        self.metrics.batches.inc()
        self.metrics.rows.labels("gpu_metrics").inc(result.metrics_inserted)
        self.metrics.rows.labels("gpu_events").inc(result.events_inserted)
        if result.times:
            self.rollup.stored(caught_up=self._caught_up)
        # records the database refused are neither rows nor duplicates: they are dead letters
        rows_skipped = len(batch.rows) - result.refused_rows - result.metrics_inserted
        events_skipped = len(batch.events) - result.refused_events - result.events_inserted
        self.metrics.duplicates.labels("gpu_metrics").inc(rows_skipped)
        self.metrics.duplicates.labels("gpu_events").inc(events_skipped)

    def _report_lag(self, *, paused: bool = False) -> None:
        """Messages behind per partition, from the stored offsets, every 10 s (partitions.report_lag)."""
        if self._lag_due.due():
            report_lag(self.consumer, self.stored, self.metrics.lag, paused=paused)

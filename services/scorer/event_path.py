"""The scorer's event fast path: each gpu-events message judges its GPU at once.

A member of the scorer's consumer group on gpu-events; the partitions the group
gives it are also the GPUs this process's cycle judges (ownership.py). For each
batch polled, the events are stored in gpu_events (whichever of the sink and
this path stores one first: the judgement then reads it like any other input),
the GPUs they name are judged as of now by the cycle's own function
(cycle.judge), committed, and the verdict changes and alerts published to
gpu-health and gpu-alerts; then the batch's offsets are committed to Kafka. No
waiting for the cycle or for settled minutes: an XID or a DBE is a verdict and
an alert within one transaction of its arrival.

A GPU another judgement wrote after this one read it (the cycle, or the GPU's
previous owner during a rebalance) is judged again, so its event counts. A
message the contract refuses is skipped (the sink dead-letters it). If the
database is away, the batch's partitions are rewound and it is tried again.

A partition resumes from the group's committed offset. One the group never
committed (a new group, or a partition no event reached yet) starts `lookback_s`
back, not at its end: an event that arrived while the partition had no owner
(a rebalance) is judged by its next owner, and a new group on an old topic does
not replay its history (what came before is in the database, the cycle's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

import confluent_kafka
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Histogram

from shared.contract.models import GpuEvent
from shared.contract.signing import Signer
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.db import connect
from shared.plumbing.errors import ContractError, GpuHealthError
from shared.plumbing.kafka import JsonProducer, closing_consumer, make_consumer, take
from shared.settings.common import DatabaseSettings, KafkaSettings
from shared.store import events as event_store
from shared.store.errors import translated

from . import cycle
from .alert_hosts import with_hostnames
from .features import Conn
from .messages import Message, publish
from .ownership import Ownership
from .rules_config import Rules

log = logging.getLogger(__name__)

EVENTS = TopicSettings.entry("events")  # what the fast path reads

JUDGE_AGAIN = 3  # times a GPU lost to a newer judgement is judged again before the cycle is left to it
REWIND_WAIT_S = 1.0
STAGES = ("store", "assess", "record", "publish")
SLOW_BATCH_S = 1.0  # a batch slower than this is logged with where its time went


class EventMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_scorer_"
        self.events = Counter(p + "events", "gpu-events messages judged by the fast path", registry=registry)
        self.refused = Counter(
            p + "events_refused", "gpu-events messages the contract refused", registry=registry
        )
        self.failures = Counter(
            p + "event_batch_failures", "Event batches rewound and tried again", registry=registry
        )
        self.latency = Histogram(
            p + "event_to_verdict_seconds",
            "From an event's Kafka timestamp to its GPU's verdict committed and published",
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.stages = Histogram(
            p + "event_stage_seconds",
            "Where a gpu-events batch spent its time: storing its events, reading its GPUs' inputs and"
            " judging (assess), writing the verdicts and alerts (record: waits on a judgement holding the"
            " same GPUs), publishing",
            ["stage"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )


class EventPath:
    """Judges the GPUs each gpu-events batch names, at once, as a member of the scorer group."""

    def __init__(
        self,
        *,
        rules: Rules,
        db: DatabaseSettings,
        kafka: KafkaSettings,
        topic: str,
        group: str,
        consumer_overrides: dict[str, object],
        batch: int,
        producer: JsonProducer,
        publish_to: dict[str, str],
        ownership: Ownership,
        as_of: Callable[[Conn, Sequence[GpuEvent]], datetime],
        lookback_s: float,
        registry: CollectorRegistry,
        signer: Signer | None = None,
    ) -> None:
        self.signer = signer
        self.rules, self.db, self.kafka, self.topic, self.group = rules, db, kafka, topic, group
        self.consumer_overrides, self.batch, self.producer = consumer_overrides, batch, producer
        self.publish_to, self.ownership, self.as_of = publish_to, ownership, as_of
        self.lookback_s = lookback_s
        self.metrics = EventMetrics(registry)
        self._conn: Conn | None = None

    def run(self, stop: threading.Event) -> None:
        consumer = make_consumer(self.kafka, group_id=self.group, overrides=self.consumer_overrides)
        with closing_consumer(consumer):
            consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
            try:
                while not stop.is_set():
                    found = take(consumer, self.batch, 0.5)
                    records = [m for m in found if not _failed(m)]
                    if records and not self._judge(consumer, records):
                        stop.wait(REWIND_WAIT_S)
            finally:
                self.ownership.revoked(self.ownership.share.partitions)
                self._close()

    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        count = len(consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions)
        consumer.assign(self._starts(consumer, partitions))
        self.ownership.assigned([p.partition for p in partitions], count)
        log.info("assigned", extra={"partitions": sorted(p.partition for p in partitions), "of": count})

    def _starts(
        self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]
    ) -> list[TopicPartition]:
        """Each partition at the group's committed offset, or `lookback_s` back where it has none."""
        starts = consumer.committed(partitions, timeout=10)
        fresh = [p for p in starts if p.offset < 0]
        if fresh:
            since_ms = int((time.time() - self.lookback_s) * 1000)
            found = consumer.offsets_for_times(
                [TopicPartition(p.topic, p.partition, since_ms) for p in fresh], timeout=10
            )
            at = {p.partition: p.offset for p in found}
            for p in fresh:  # -1: nothing that recent, so the end
                p.offset = at[p.partition] if at.get(p.partition, -1) >= 0 else confluent_kafka.OFFSET_END
        return list(starts)

    def _on_revoke(self, _consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]) -> None:
        self.ownership.revoked([p.partition for p in partitions])
        log.info("revoked", extra={"partitions": sorted(p.partition for p in partitions)})

    def _judge(self, consumer: confluent_kafka.Consumer, records: list[confluent_kafka.Message]) -> bool:
        """Store, judge, publish and commit one batch; False (rewound, to be tried again) on a failure."""
        try:
            self.judge_records(records)
        except (GpuHealthError, OSError) as e:
            self.metrics.failures.inc()
            log.error("event batch failed, rewinding to try again: %s", e)
            self._close()
            _rewind(consumer, records)
            return False
        consumer.commit(offsets=_next_offsets(records), asynchronous=True)
        return True

    def judge_records(self, records: Sequence[confluent_kafka.Message]) -> list[Message]:
        """Judge the GPUs these gpu-events records name; the messages published."""
        found: list[GpuEvent] = []
        stamps: list[float] = []  # the Kafka timestamps of the records judged, in seconds
        for record in records:
            try:
                found.append(EVENTS.read(GpuEvent, record.value() or b""))
            except ContractError as e:
                self.metrics.refused.inc()
                log.warning("event refused by its contract, not judged: %s", e)
                continue
            kind, stamp = record.timestamp()
            if kind != confluent_kafka.TIMESTAMP_NOT_AVAILABLE:
                stamps.append(stamp / 1000)
        if not found:
            return []
        stages = dict.fromkeys(STAGES, 0.0)
        started = time.perf_counter()
        conn = self._connection()
        event_store.insert_events(conn, found)
        with translated(conn):
            conn.commit()
        stages["store"] = time.perf_counter() - started
        messages = self.judge_gpus(conn, found, stages)
        done = time.time()
        for sent in stamps:
            self.metrics.latency.observe(max(0.0, done - sent))
        self.metrics.events.inc(len(found))
        for stage, seconds in stages.items():
            self.metrics.stages.labels(stage).observe(seconds)
        if sum(stages.values()) > SLOW_BATCH_S:
            oldest = round(done - min(stamps, default=done), 3)  # since its oldest event reached Kafka
            spent = {f"{k}_s": round(v, 3) for k, v in stages.items()}
            log.warning("slow event batch", extra={"events": len(found), "oldest_s": oldest, **spent})
        return messages

    def judge_gpus(
        self, conn: Conn, found: Sequence[GpuEvent], stages: dict[str, float] | None = None
    ) -> list[Message]:
        """Judge the GPUs of `found` now, again for those a newer judgement took, and publish; the time
        of each stage added to `stages`."""
        took = dict.fromkeys(STAGES, 0.0) if stages is None else stages
        gpus = sorted({e.gpu_uuid for e in found})
        messages: list[Message] = []
        for _ in range(JUDGE_AGAIN):
            started = time.perf_counter()
            assessment = cycle.assess(conn, self.as_of(conn, found), self.rules, gpus=gpus, predictions={})
            read = time.perf_counter()
            result = cycle.record(conn, assessment)
            took["assess"] += read - started
            took["record"] += time.perf_counter() - read
            messages.extend(result.messages)
            gpus = sorted(result.skipped)
            if not gpus:
                break
        started = time.perf_counter()
        with_hostnames(conn, messages)
        with translated(conn):
            conn.rollback()  # the hostnames' read
        publish(self.producer, self.signer, self.publish_to, messages)
        took["publish"] += time.perf_counter() - started
        return messages

    def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.db)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _failed(record: confluent_kafka.Message) -> bool:
    err = record.error()
    if err is None:
        return False
    if err.code() != confluent_kafka.KafkaError._PARTITION_EOF:
        log.warning("gpu-events consumer: %s", err.str())
    return True


def _offsets(records: Sequence[confluent_kafka.Message]) -> dict[tuple[str, int], list[int]]:
    """Per (topic, partition), the offsets of its records (a consumed record always has all three)."""
    out: dict[tuple[str, int], list[int]] = {}
    for r in records:
        out.setdefault((str(r.topic()), int(r.partition() or 0)), []).append(int(r.offset() or 0))
    return out


def _next_offsets(records: Sequence[confluent_kafka.Message]) -> list[TopicPartition]:
    """Per partition, the offset after the last record judged."""
    return [TopicPartition(t, p, max(o) + 1) for (t, p), o in _offsets(records).items()]


def _rewind(consumer: confluent_kafka.Consumer, records: Sequence[confluent_kafka.Message]) -> None:
    """Back to each partition's first record of the batch, so the batch comes again."""
    for (topic, partition), offsets in _offsets(records).items():
        offset = min(offsets)
        try:
            consumer.seek(TopicPartition(topic, partition, offset))
        except confluent_kafka.KafkaException as e:  # revoked meanwhile: its next owner reads it
            log.warning("cannot rewind %s[%d]: %s", topic, partition, e)

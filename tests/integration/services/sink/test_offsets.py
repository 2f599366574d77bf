"""Offsets never pass an unstored record, dead letters are sent once, lag is true while stalled.

The database is made to stall the sink by a test connection holding an
exclusive lock on the schema's kafka_offsets table (the sink's statement
timeout then fails each try, as a slow or unreachable database would).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial

import confluent_kafka
import pytest
from prometheus_client import CollectorRegistry

from evaluation.pipeline import make_loop, stored_offsets_total, wait_until
from services.sink.deadletters import DeadLetter, DeadLetterRelay
from services.sink.metrics import SinkMetrics
from services.sink.writer import Batch, BatchWriter
from shared.fakes.samples import sample
from shared.plumbing.db import connect
from shared.plumbing.kafka import make_consumer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.kafka import consume_all, header_map
from tests.helpers.sink import count, counter_value, env_for, running, sink_process, sink_topics, sink_until

Placed = dict[tuple[int, int], tuple[str, str]]  # (partition, offset) -> (gpu_uuid, time)


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return sink_topics(topic_factory)


def produce_placed(kafka: KafkaSettings, topic: str, start: int, stop: int, placed: Placed) -> None:
    """Produce samples start..stop, noting where each one landed."""
    producer = make_producer(kafka)

    def landed(
        gpu: str, at: str
    ) -> Callable[[confluent_kafka.KafkaError | None, confluent_kafka.Message], None]:
        def done(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            assert err is None, err
            placed[(msg.partition() or 0, msg.offset() or 0)] = (gpu, at)

        return done

    for i in range(start, stop):
        s = sample(i)
        value, done = json.dumps(s).encode(), landed(s["gpu_uuid"], s["time"])
        producer.produce(topic, key=s["gpu_uuid"].encode(), value=value, on_delivery=done)
    assert producer.flush(60) == 0


def unstored_below_stored_offsets(db: DatabaseSettings, group: str, topic: str, placed: Placed) -> int:
    """Records behind a stored offset that are not in the database: must always be 0."""
    with connect(db) as conn:
        stored: dict[object, object] = dict(
            conn.execute(
                "SELECT partition, next_offset FROM kafka_offsets WHERE consumer_group = %s AND topic = %s",
                (group, topic),
            ).fetchall()  # type: ignore[arg-type]
        )
        rows = {
            (str(gpu), at.astimezone(UTC).isoformat())
            for gpu, at in conn.execute("SELECT gpu_uuid, time FROM gpu_metrics").fetchall()
            if isinstance(at, datetime)
        }
    behind = [
        (gpu, datetime.fromisoformat(at).astimezone(UTC).isoformat())
        for (partition, offset), (gpu, at) in placed.items()
        if offset < int(str(stored.get(partition, 0)))
    ]
    return sum(1 for record in behind if record not in rows)


@contextmanager
def offsets_locked(db: DatabaseSettings) -> Iterator[Callable[[], None]]:
    """Hold kafka_offsets exclusively: every batch write times out until released (call the result)."""
    conn = connect(db)
    conn.execute("LOCK TABLE kafka_offsets IN ACCESS EXCLUSIVE MODE")
    try:
        yield conn.rollback
    finally:
        conn.rollback()
        conn.close()


class Lines:
    """The sink process's log lines, read as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def count_at_least(self, text: str, n: int) -> bool:
        return self.count(text) >= n


def test_sigterm_during_a_retry_loses_nothing(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """The issue's loss: SIGTERM while a batch is retried, the database back as the sink stops."""
    n_first, n = 1000, 6000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    env = env_for(kafka_settings, migrated, topics, group) | {"GPUHEALTH_SINK__STATEMENT_TIMEOUT_MS": "1000"}
    placed: Placed = {}
    produce_placed(kafka_settings, topics.metrics_raw, 0, n_first, placed)
    proc = sink_process(env)
    log = Lines(proc)
    try:
        wait_until(lambda: stored_offsets_total(migrated, group) == n_first, 60, "the first records stored")
        with offsets_locked(migrated) as release:
            produce_placed(kafka_settings, topics.metrics_raw, n_first, n, placed)
            wait_until(lambda: log.count("retrying") >= 2, 60, "the sink to be retrying a batch")
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: log.count("stopping with an unstored batch") >= 1, 60, "the sink to give up")
            release()  # the database is back while the sink is on its way out
            assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert unstored_below_stored_offsets(migrated, group, topics.metrics_raw, placed) == 0
    assert stored_offsets_total(migrated, group) == count(migrated, "gpu_metrics")
    sink_until(env, lambda: stored_offsets_total(migrated, group) == n, "the restarted sink to finish")
    assert count(migrated, "gpu_metrics") == n  # 0 lost, 0 twice


def test_lag_is_true_while_partitions_are_paused(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    group = f"sink-{uuid.uuid4().hex[:8]}"
    produce_placed(kafka_settings, topics.metrics_raw, 0, 400, {})
    loop = make_loop(kafka_settings, migrated, topics, group)
    loop.writer.statement_timeout_ms = 1000  # before its first connection: each try fails in a second
    with running(loop):
        wait_until(lambda: stored_offsets_total(migrated, group) == 400, 60, "the first records stored")
        with offsets_locked(migrated):
            produce_placed(kafka_settings, topics.metrics_raw, 400, 1000, {})
            wait_until(lambda: lag(loop.metrics) == 600, 60, "the lag to show the 600 records not stored")
            assert counter_value(loop.metrics.db_retries) >= 1  # paused and retrying all along
        wait_until(lambda: stored_offsets_total(migrated, group) == 1000, 60, "the rest stored")
        wait_until(lambda: lag(loop.metrics) == 0, 60, "the lag back to 0")
    assert count(migrated, "gpu_metrics") == 1000


def lag(metrics: SinkMetrics) -> float:
    return sum(s.value for m in metrics.lag.collect() for s in m.samples)


def test_dead_letters_are_sent_once_even_when_the_mark_was_lost(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """Delivered, then the sink died before marking them: the next relay finds them and does not resend."""
    group = "g1"
    writer = BatchWriter(migrated, group=group, connections=1)
    letters = [DeadLetter(b"k", b"bad %d" % i, "raw", 0, i, "contract", f"reason {i}") for i in range(5)]
    writer.write(Batch(dead=letters, next_offsets={("raw", 0): 5}))
    writer.close()

    def relay(**kw: object) -> DeadLetterRelay:
        return DeadLetterRelay(
            settings=migrated, producer=make_producer(kafka_settings), topic=topics.dead_letters, group=group,
            metrics=SinkMetrics(CollectorRegistry()), **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    first = relay()
    leased = first._lease()
    assert first._produce(leased) == {d.source for d in letters}  # delivered ... and then the crash
    first.close()
    with connect(migrated) as conn:
        conn.execute("UPDATE sink_dead_letters SET leased_until = now() - interval '1 second'")
        conn.commit()
    second = relay(reader=lambda: make_consumer(kafka_settings, group_id=f"check-{uuid.uuid4().hex[:6]}"))
    assert second.deliver_pending() == 5
    second.close()
    dead = consume_all(kafka_settings, topics.dead_letters, expected=6, timeout_s=5)
    assert sorted(int(header_map(m)["dlq.source.offset"]) for m in dead) == [0, 1, 2, 3, 4]
    with connect(migrated) as conn:
        left = conn.execute("SELECT count(*) FROM sink_dead_letters WHERE delivered_at IS NULL").fetchone()
    assert left == (0,)


def test_dead_letters_are_not_repeated_by_restarts(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    group = f"sink-{uuid.uuid4().hex[:8]}"
    env = env_for(kafka_settings, migrated, topics, group)
    producer = make_producer(kafka_settings)
    bad = 0
    for i in range(6000):
        s = sample(i)
        producer.produce(topics.metrics_raw, key=s["gpu_uuid"].encode(), value=json.dumps(s).encode())
        if i % 50 == 0:
            producer.produce(
                topics.metrics_raw, key=s["gpu_uuid"].encode(), value=b'{"schema_version": 1, %d' % i
            )
            bad += 1
    assert producer.flush(30) == 0
    first = sink_process(env)
    try:
        wait_until(lambda: count(migrated, "gpu_metrics") >= 1500, 60, "the sink to be mid-stream")
        first.kill()  # no goodbye
        first.wait(10)
    finally:
        first.kill()
    for _ in range(2):  # the second restart finds everything done: it must send nothing again
        proc = sink_process(env)
        log = Lines(proc)
        try:
            wait_until(
                partial(log.count_at_least, "partitions assigned", 1), 60, "the sink to own its partitions"
            )
            wait_until(lambda: stored_offsets_total(migrated, group) == 6000 + bad, 120, "every record done")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    dead = consume_all(kafka_settings, topics.dead_letters, expected=bad, timeout_s=60, linger_s=3)
    sources = [int(header_map(m)["dlq.source.offset"]) for m in dead]
    assert len(dead) == bad
    assert len(set(sources)) == bad
    assert count(migrated, "gpu_metrics") == 6000

"""Producing samples and running sinks for the sink's integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from evaluation.pipeline import wait_until
from services.sink.build import sink_loop_closed
from services.sink.loop import SinkLoop
from shared.fakes.samples import T0, sample
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import running as running_loop
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.scorer_fleet import event_message
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO


def produce_samples(settings: KafkaSettings, topic: str, start: int, stop: int, gpus: int = 50) -> None:
    producer = JsonProducer(make_producer(settings))
    for i in range(start, stop):
        s = sample(i, gpus)
        producer.produce(topic, s["gpu_uuid"], s)
    assert producer.flush(60) == 0


EVENT_EVERY = 100  # produce_mix: one gpu-events message per this many samples


def produce_mix(settings: KafkaSettings, topics: TopicSettings, start: int, stop: int) -> int:
    """Samples `start` to `stop`, an XID event every EVENT_EVERY of them, and one message that is no JSON
    (a dead letter): every table a batch writes. Returns how many messages that was."""
    raw = make_producer(settings)
    producer = JsonProducer(raw)
    sent = 0
    for i in range(start, stop):
        s = sample(i)
        producer.produce(topics.metrics_raw, s["gpu_uuid"], s)
        sent += 1
        if i % EVENT_EVERY == 0:
            at = T0 + timedelta(seconds=i)
            event = event_message(s["gpu_uuid"], "xid", {"xid": 79}, at)
            producer.produce(topics.events, s["gpu_uuid"], event)
            sent += 1
    raw.produce(topics.metrics_raw, key=b"hostile", value=b"{not json")
    assert producer.flush(60) == 0
    return sent + 1


def stored_by_topic(db: DatabaseSettings, group: str) -> dict[str, int]:
    """The next offsets `group` stored, summed per topic: the messages of each it has done."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT topic, sum(next_offset) FROM kafka_offsets WHERE consumer_group = %s GROUP BY topic",
            (group,),
        ).fetchall()
    return {str(topic): int(str(n)) for topic, n in rows}


def assert_no_offset_past_an_unstored_row(db: DatabaseSettings, topics: TopicSettings, group: str) -> None:
    """Per topic, what the stored offsets say is done is exactly what is in the tables: its rows and its
    dead letters (every message of these tests' topics is one of them, and each is stored once)."""
    stored = stored_by_topic(db, group)
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT source_topic, count(*) FROM sink_dead_letters"
            " WHERE consumer_group = %s GROUP BY source_topic",
            (group,),
        ).fetchall()
    dead = {str(topic): int(str(n)) for topic, n in rows}
    for topic, table in ((topics.metrics_raw, "gpu_metrics"), (topics.events, "gpu_events")):
        in_tables, done = count(db, table) + dead.get(topic, 0), stored.get(topic, 0)
        assert in_tables == done, f"{topic}: {in_tables} stored, the offsets say {done}"


def count(db: DatabaseSettings, table: str) -> int:
    with connect(db) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(str(row[0])) if row else 0


def counter_value(counter: Any, **labels: str) -> float:
    """A prometheus_client counter's total, summed over children matching `labels`."""
    return sum(
        float(s.value)
        for metric in counter.collect()
        for s in metric.samples
        if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items())
    )


@contextmanager
def running(loop: SinkLoop) -> Iterator[SinkLoop]:
    """`loop` running on a thread for the block; then stopped, joined, and its consumer and writer closed."""
    with sink_loop_closed(loop), running_loop(loop, name="test-sink"):
        yield loop


def sink_process(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.sink"], cwd=REPO, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def env_for(kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str) -> dict[str, str]:
    return {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "GPUHEALTH_DB__HOST": db.host, "GPUHEALTH_DB__PORT": str(db.port),
        "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
        **topics_env(topics), "GPUHEALTH_SINK__GROUP_ID": group,
        "GPUHEALTH_SINK__METRICS_PORT": "0", "GPUHEALTH_SINK__BATCH_SIZE": "500",
        "GPUHEALTH_SINK__SESSION_TIMEOUT_MS": "6000",
    }  # fmt: skip


def sink_topics(topic_factory: Callable[..., str], dlq_partitions: int = 1) -> TopicSettings:
    """Fresh topics for one sink test, every one of them: raw (4 partitions), events (2), the dead-letter
    topic (`dlq_partitions`) and the record families' (1 each)."""
    return isolated_topics(topic_factory, metrics_raw=4, events=2, dead_letters=dlq_partitions)


def sink_until(env: dict[str, str], done: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    """Run the sink process until `done`, then stop it with SIGTERM: it must exit 0."""
    proc = sink_process(env)
    try:
        wait_until(done, timeout_s, what)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0

"""Producing samples and running sinks for the sink's integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from evaluation.pipeline import wait_until
from services.sink.build import sink_loop_closed
from services.sink.loop import SinkLoop
from shared.config import DatabaseSettings, KafkaSettings, TopicSettings
from shared.db import connect
from shared.fakes.samples import sample
from shared.kafka import JsonProducer, make_producer
from shared.lifecycle import running as running_loop
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO


def produce_samples(settings: KafkaSettings, topic: str, start: int, stop: int, gpus: int = 50) -> None:
    producer = JsonProducer(make_producer(settings))
    for i in range(start, stop):
        s = sample(i, gpus)
        producer.produce(topic, s["gpu_uuid"], s)
    assert producer.flush(60) == 0


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

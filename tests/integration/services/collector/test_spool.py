"""The collector process stopped while its broker is away loses nothing and duplicates nothing.

A private broker (throwaway_kafka) stands in for the shared one, which is never
stopped. The collector runs as `python -m services.collector` against an
in-process mock node, whose scrape counter says how many samples were published.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from services.collector.metrics import CollectorMetrics
from services.collector.publisher import Publisher, collector_producer
from services.collector.spool import SpooledRecord, SpoolFile, SpoolingProducer, delivered_already
from services.mock_dcgm.server import MockServer
from shared.contract.models import parse_sample
from shared.plumbing.kafka import make_admin, make_producer
from shared.plumbing.topic_admin import TopicSpec, ensure_topics
from shared.settings.common import KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.throwaway_kafka import ThrowawayBroker
from tests.paths import REPO

GPUS = 4


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        threading.Event().wait(0.1)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThrowawayBroker]:
    kafka = ThrowawayBroker(tmp_path / "kafka")
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture
def node() -> Iterator[MockServer]:
    with served_fleet(nodes=1, gpus=GPUS, seed=5) as (_, server):
        yield server


def scrapes(server: MockServer) -> int:
    return int(server.registry.get_sample_value("gpuhealth_mock_scrapes_total", {"node": "0"}) or 0)


class CollectorProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "services.collector"], env=env, cwd=REPO,
                                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=90)
        finally:
            if self.process.poll() is None:
                self.process.kill()

    def logged(self, message: str) -> list[dict[str, object]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("msg") == message]


def test_stopped_while_the_broker_is_away_it_spools_and_resends_first_without_loss_or_duplicate(
    broker: ThrowawayBroker, node: MockServer, tmp_path: Path
) -> None:
    raw, events = "spool-raw", "spool-events"
    ensure_topics(make_admin(broker.settings), [TopicSpec(name=t, partitions=3, replication_factor=1)
                                                for t in (raw, events)])  # fmt: skip
    spool = tmp_path / "spool" / "collector.jsonl"
    env = os.environ | {
        "PYTHONPATH": str(REPO), **broker.client_env(),
        "GPUHEALTH_TOPICS__METRICS_RAW": raw, "GPUHEALTH_TOPICS__EVENTS": events,
        "GPUHEALTH_COLLECTOR__SOURCE": "mock",
        "GPUHEALTH_COLLECTOR__DCGM_URLS": json.dumps([node.node_url(0)]),
        "GPUHEALTH_COLLECTOR__INTERVAL_S": "0.5", "GPUHEALTH_COLLECTOR__METRICS_PORT": "0",
        "GPUHEALTH_COLLECTOR__COLLECTOR_ID": "spool-test", "GPUHEALTH_COLLECTOR__SPOOL_PATH": str(spool),
        "GPUHEALTH_COLLECTOR__SHUTDOWN_FLUSH_S": "2", "GPUHEALTH_LOG__JSON": "true",
    }  # fmt: skip
    first = CollectorProcess(env, tmp_path / "collector-1.log")
    try:
        assert len(consume_all(broker.settings, raw, expected=2 * GPUS, timeout_s=120)) >= 2 * GPUS
        broker.stop()
        before = scrapes(node)
        wait_until(lambda: scrapes(node) >= before + 10, "ten polls while the broker is away")
    finally:
        assert first.terminate() == 0
    (spooled,) = first.logged("the broker did not take every message: spooled for the next start")
    assert isinstance(spooled["spooled"], int)
    assert spooled["spooled"] >= 10 * GPUS
    assert spooled["lost"] == 0
    assert spool.exists()

    broker.start()
    second = CollectorProcess(env, tmp_path / "collector-2.log")
    try:
        wait_until(lambda: not spool.exists(), "every spooled message was delivered")
        resumed = scrapes(node)
        wait_until(lambda: scrapes(node) >= resumed + 4, "four more polls")
    finally:
        assert second.terminate() == 0
    assert second.logged("every spooled message was delivered")
    assert not spool.exists()

    published = scrapes(node) * GPUS  # every scrape was one sample per GPU, all published
    messages = consume_all(broker.settings, raw, expected=published, timeout_s=120)
    samples = [(m.key(), m.offset() or 0, parse_sample(m.value() or b"")) for m in messages]
    seen: dict[tuple[bytes | None, datetime], list[int]] = defaultdict(list)
    for key, offset, sample in samples:
        seen[(key, sample.time)].append(offset)
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert twice == {}  # nothing twice
    assert len(samples) == published  # nothing lost
    by_gpu: dict[bytes | None, list[tuple[int, datetime]]] = defaultdict(list)
    for key, offset, sample in samples:
        assert key == sample.gpu_uuid.encode()
        by_gpu[key].append((offset, sample.time))
    for series in by_gpu.values():  # the spooled samples went out before the new ones
        times = [t for _, t in sorted(series)]
        assert times == sorted(times)
    event_values = [m.value() for m in consume_all(broker.settings, events, expected=10**6, timeout_s=5)]
    assert len(event_values) == len(set(event_values))


def test_spooled_messages_the_broker_already_has_are_not_resent_and_the_rest_keep_headers_and_time(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(prefix="spool")
    now_ms = time.time_ns() // 1_000_000
    records = [
        SpooledRecord(
            topic, f"GPU-{i}".encode(), b'{"i":%d}' % i, (("trace", bytes([i, 0, 255])),), now_ms + i
        )
        for i in range(10)
    ]
    # The first four reached the broker before the collector stopped; their acknowledgements did not.
    earlier = make_producer(kafka_settings)
    for i, r in enumerate(records[:4]):
        earlier.produce(topic, value=r.value, key=r.key, headers=list(r.headers), timestamp=now_ms + i)
    assert earlier.flush(30) == 0
    path = tmp_path / "spool.jsonl"
    SpoolFile(path, 1 << 20).save(records)

    producer = SpoolingProducer(collector_producer(kafka_settings, 1000))
    publisher = Publisher(producer, CollectorMetrics(CollectorRegistry()), SpoolFile(path, 1 << 20))
    assert publisher.resume(lambda pending: delivered_already(kafka_settings, pending, 30)) == 6
    assert publisher.close(30) == 0
    assert not path.exists()

    messages = consume_all(kafka_settings, topic, expected=10, timeout_s=60)
    got = sorted((m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]) for m in messages)
    assert got == sorted((r.key, r.value, r.headers, r.timestamp_ms) for r in records)

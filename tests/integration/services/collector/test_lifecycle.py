"""The collector process stopped by SIGTERM mid-poll: exit 0, and every scraped sample is on the topic."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evaluation.pipeline import wait_until
from services.mock_dcgm.server import MockServer
from shared.settings.common import KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.service_process import service_process, sigterm
from tests.helpers.topics import isolated_topics, topics_env

GPUS = 4


@pytest.fixture
def node() -> Iterator[MockServer]:
    with served_fleet(nodes=1, gpus=GPUS, seed=9) as (_, server):
        yield server


def scrapes(server: MockServer) -> int:
    return int(server.registry.get_sample_value("gpuhealth_mock_scrapes_total", {"node": "0"}) or 0)


def test_sigterm_mid_work_exits_0_with_every_polled_sample_published(
    node: MockServer, kafka_settings: KafkaSettings, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topics = isolated_topics(topic_factory)
    raw = topics.metrics_raw
    spool = tmp_path / "spool.jsonl"
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        **topics_env(topics),
        "GPUHEALTH_COLLECTOR__SOURCE": "mock",
        "GPUHEALTH_COLLECTOR__DCGM_URLS": json.dumps([node.node_url(0)]),
        "GPUHEALTH_COLLECTOR__INTERVAL_S": "0.1", "GPUHEALTH_COLLECTOR__METRICS_PORT": "0",
        "GPUHEALTH_COLLECTOR__COLLECTOR_ID": "lifecycle-test", "GPUHEALTH_COLLECTOR__SPOOL_PATH": str(spool),
    }  # fmt: skip
    with service_process("collector", env) as proc:
        wait_until(lambda: scrapes(node) >= 5, 60, "five polls")
        sigterm(proc)  # polling every 0.1 s: a poll is in hand or about to be
    polled = scrapes(node) * GPUS  # the poll in hand when the signal came is finished, then flushed
    assert len(consume_all(kafka_settings, raw, expected=polled, timeout_s=30)) == polled
    assert not spool.exists() or spool.stat().st_size == 0  # nothing left behind for the next start

"""OTLP export of the real collector and sink processes, received by OTLP receivers this test runs.

gRPC: the collector, polling a mock fleet and publishing to the real broker,
exports the GPU gauges and counters (with each GPU's identity and placement)
and its own metrics. HTTP/protobuf: the sink, writing to the real database,
exports its own metrics; its export interval is a minute, so the points can
only arrive through the flush on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from services.mock_dcgm.fleet import Fleet
from services.mock_dcgm.server import MockServer
from shared.plumbing.otlp import project_version
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all, kafka_env
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.otlp_receiver import Point, grpc_receiver, http_receiver
from tests.helpers.sink import count, produce_samples
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO


def service(module: str, env: dict[str, str]) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "OTEL_"))}
    return subprocess.Popen(
        [sys.executable, "-m", module], cwd=REPO, env={**clean, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the exit code must be 0; returns the output."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out


@pytest.fixture
def fleet() -> Iterator[tuple[Fleet, MockServer]]:
    with served_fleet(nodes=2, gpus=2, seed=5) as served:
        yield served


def gpu_points(points: list[Point], metric: str) -> dict[str, Point]:
    return {str(p.attributes["gpu.uuid"]): p for p in points if p.metric == metric}


def test_collector_exports_gpu_gauges_and_its_own_metrics_over_grpc(
    fleet: tuple[Fleet, MockServer], kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    sim, server = fleet
    uuids = {g.uuid: node.hostname for node in sim.nodes for g in node.gpus}
    topics = isolated_topics(topic_factory)
    raw = topics.metrics_raw
    with grpc_receiver() as (endpoint, received):
        proc = service("services.collector", {
            **kafka_env(kafka_settings),
            **topics_env(topics),
            "GPUHEALTH_COLLECTOR__SOURCE": "mock", "GPUHEALTH_COLLECTOR__INTERVAL_S": "0.5",
            "GPUHEALTH_COLLECTOR__DCGM_URLS": json.dumps([server.node_url(0), server.node_url(1)]),
            "GPUHEALTH_COLLECTOR__CLUSTER": "train-a", "GPUHEALTH_COLLECTOR__DATACENTER": "dc-7",
            "GPUHEALTH_COLLECTOR__RACK": "r12", "GPUHEALTH_COLLECTOR__METRICS_PORT": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=itest",
        })  # fmt: skip
        try:
            points = received.wait_for(
                lambda ps: (
                    set(gpu_points(ps, "gpuhealth.gpu.gpu_temp_c")) == set(uuids)
                    and any(p.metric == "gpuhealth_collector_samples_published" and p.value > 0 for p in ps)
                ),
                timeout_s=60,
            )
        finally:
            stop(proc)
        # the flush on SIGTERM carries the final count of what was published
        final = received.points()
    total = max(p.value for p in final if p.metric == "gpuhealth_collector_samples_published")
    published: dict[str, set[float]] = {}
    for message in consume_all(kafka_settings, raw, int(total)):
        sample = json.loads(message.value() or b"{}")
        published.setdefault(sample["gpu_uuid"], set()).add(sample["gpu_temp_c"])
    temps = gpu_points(points, "gpuhealth.gpu.gpu_temp_c")
    for gpu, point in temps.items():
        assert (point.kind, point.unit) == ("gauge", "Cel")
        assert point.value in published[gpu], "the exported temperature is one the collector read"
        assert point.attributes["host.name"] == uuids[gpu]
        assert point.attributes["cluster"] == "train-a"
        assert point.attributes["datacenter"] == "dc-7"
        assert point.attributes["rack"] == "r12"
        assert point.attributes["gpu.source"] == "mock"
        assert point.attributes["gpu.model"]
        assert isinstance(point.attributes["gpu.index"], int)
        assert point.resource["service.name"] == "gpuhealth-collector"
        assert point.resource["service.version"] == project_version()
        assert point.resource["host.name"] == socket.gethostname()
        assert point.resource["deployment.environment"] == "itest"
    energy = gpu_points(points, "gpuhealth.gpu.total_energy_mj")
    assert set(energy) == set(uuids)
    assert all(p.kind == "sum" and p.monotonic and p.value > 0 for p in energy.values())
    scrape = [p for p in points if p.metric == "gpuhealth_collector_scrape_seconds"]
    assert scrape
    assert all(p.kind == "histogram" and sum(p.bucket_counts) == p.value for p in scrape)


def test_sink_exports_its_metrics_over_http_and_flushes_them_on_sigterm(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    topics = isolated_topics(topic_factory, metrics_raw=2)
    raw = topics.metrics_raw
    n = 300
    produce_samples(kafka_settings, raw, 0, n, gpus=10)
    with http_receiver() as (endpoint, received):
        proc = service("services.sink", {
            **kafka_env(kafka_settings),
            "GPUHEALTH_DB__HOST": migrated.host, "GPUHEALTH_DB__PORT": str(migrated.port),
            "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
            **topics_env(topics),
            "GPUHEALTH_SINK__GROUP_ID": f"sink-{uuid.uuid4().hex[:8]}", "GPUHEALTH_SINK__METRICS_PORT": "0",
            "GPUHEALTH_OTLP__ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": endpoint + "/v1/metrics",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf", "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            "OTEL_SERVICE_NAME": "sink-eu-1",
        })  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while count(migrated, "gpu_metrics") < n:
                assert time.monotonic() < deadline, "the sink did not store the samples"
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                threading.Event().wait(0.1)  # between two counts, not a wait for time to pass
            assert received.requests == 0, "nothing is exported before the first minute"
        finally:
            stop(proc)
        points = received.wait_for(lambda ps: len(ps) > 0, timeout_s=5)
    rows = [p for p in points if p.metric == "gpuhealth_sink_rows_written"]
    assert [(p.attributes["table"], p.kind, p.monotonic, p.value) for p in rows if p.value] == [
        ("gpu_metrics", "sum", True, n)
    ]
    resource = rows[0].resource
    assert resource["service.name"] == "sink-eu-1"  # OTEL_SERVICE_NAME wins over the default
    assert resource["service.version"] == project_version()
    assert resource["host.name"] == socket.gethostname()
    batches = [p for p in points if p.metric == "gpuhealth_sink_batch_seconds"]
    assert [p.kind for p in batches] == ["histogram"]
    assert batches[0].value >= 1
    refresh = "gpuhealth_sink_rollup_last_refresh_timestamp_seconds"
    assert [p.value > time.time() - 600 for p in points if p.metric == refresh] == [True]

"""Workload telemetry end to end: mock -> collector/monitor -> Kafka -> sink -> database -> API."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from evaluation.pipeline import wait_until
from services.collector.metrics import CollectorMetrics
from services.collector.process_sources import MockProcesses
from services.collector.processes import ProcessWatch
from services.collector.publisher import Publisher, collector_producer
from services.llm_monitor.monitor import Monitor
from services.llm_monitor.proxy import OllamaProxy
from services.llm_monitor.servers import poll_ollama
from services.llm_monitor.settings import LlmSection, LlmSettings
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from services.mock_ollama.server import MockOllamaServer
from services.sink.metrics import SinkMetrics
from services.sink.workload import WorkloadLoop
from shared.contract.models import to_json
from shared.contract.models_workload import GpuProcess, GpuProcesses, ProcessClass
from shared.gpu.process_rules import ProcessRules
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import running
from shared.settings.common import DatabaseSettings, KafkaSettings, Settings, TopicSettings
from tests.helpers.identities import VIEWER, api_app, as_role
from tests.helpers.kafka import consume_all, header_map
from tests.helpers.ports import free_port
from tests.helpers.topics import isolated_topics
from tests.paths import DATA, REPO


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory, dead_letters=1)


@pytest.fixture
def sink(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> Iterator[WorkloadLoop]:
    settings = Settings(kafka=kafka_settings, db=migrated, topics=topics)
    with (
        WorkloadLoop.from_settings(
            settings, group_id=f"test-{topics.processes}", metrics=SinkMetrics(CollectorRegistry())
        ) as workload,
        running(workload, name="sink-workload"),
    ):
        yield workload


@pytest.fixture
def api(migrated: DatabaseSettings) -> Iterator[TestClient]:
    with TestClient(headers=as_role("viewer"), app=api_app(migrated)) as client:
        yield client


def count(db: DatabaseSettings, query: str) -> int:
    with connect(db) as conn:
        row = conn.execute(query).fetchone()
    return int(str(row[0])) if row else 0


def test_mock_fleet_processes_flow_to_the_api(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topics: TopicSettings,
    sink: WorkloadLoop,
    api: TestClient,
) -> None:
    t = [0.0]
    fleet = Fleet(
        FleetSpec(nodes=2, gpus_per_node=4), SimClock(start_s=time.time() - 3 * 3600, monotonic=lambda: t[0])
    )
    t[0] = 3 * 3600  # three simulated hours in: some GPUs run jobs, some are idle
    mock = MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False)
    mock.start()
    try:
        publisher = Publisher(
            JsonProducer(collector_producer(kafka_settings, 1000)), CollectorMetrics(CollectorRegistry())
        )
        watch = ProcessWatch(
            sources=[MockProcesses(mock.node_url(i)) for i in range(2)],
            rules=ProcessRules.load(),
            publisher=publisher,
            topics=topics,
            collector_id="it",
            interval_s=1,
        )
        assert watch.poll_once() == 8
        assert publisher.flush(30) == 0
    finally:
        mock.stop()
    busy = {g.uuid: g for node in fleet.nodes for g in node.gpus if g.job is not None}
    idle = [g.uuid for node in fleet.nodes for g in node.gpus if g.job is None]
    assert busy, "the simulated fleet should be running jobs three hours in"
    wait_until(lambda: count(migrated, "SELECT count(*) FROM gpu_process_latest") == 8, 60, "8 GPUs stored")

    uuid, gpu = next(iter(busy.items()))
    answer = api.get(f"/api/v1/gpus/{uuid}/processes").json()
    (process,) = answer["processes"]
    assert answer["process_count"] == 1
    assert answer["hostname"].startswith("gpu-node-")
    assert (process["classification"], process["rule"]) == ("training", "distributed-worker")
    assert f"--local-rank={gpu.index}" in process["command_line"]
    assert process["user"] == "mluser"
    assert process["pod_uid"]
    assert len(process["container_id"]) == 64
    assert process["used_memory_mib"] > 0
    if idle:
        assert api.get(f"/api/v1/gpus/{idle[0]}/processes").json()["processes"] == []
    assert api.get("/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/processes").status_code == 404

    fleet_view = api.get("/api/v1/fleet/processes").json()
    assert (fleet_view["gpus_listed"], fleet_view["gpus_busy"], fleet_view["processes"]) == (
        8,
        len(busy),
        len(busy),
    )
    assert fleet_view["by_class"] == [
        {
            "classification": "training",
            "processes": len(busy),
            "gpus": len(busy),
            "used_memory_mib": fleet_view["by_class"][0]["used_memory_mib"],
            "pods": len(busy),
        }
    ]
    assert fleet_view["by_rule"] == [
        {"rule": "distributed-worker", "classification": "training", "processes": len(busy)}
    ]
    assert api.get("/api/v1/fleet/processes?hostname=gpu-node-99").json()["gpus_listed"] == 0
    assert api.get("/api/v1/fleet/processes?hostname=;drop").status_code == 422


def test_llm_sessions_flow_from_the_proxy_to_per_model_percentiles(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topics: TopicSettings,
    sink: WorkloadLoop,
    api: TestClient,
) -> None:
    mock = MockOllamaServer("127.0.0.1", 0, time_scale=0.02).start()
    settings = LlmSettings(
        kafka=kafka_settings, topics=topics, llm=LlmSection(ollama_url=mock.url, monitor_id="it")
    )
    producer = JsonProducer(make_producer(kafka_settings))
    monitor = Monitor(settings, producer, CollectorRegistry())
    seen: list[Any] = []

    def record(session: Any) -> None:
        seen.append(session)
        monitor.publish(session)

    async def traffic() -> None:
        proxy = OllamaProxy(upstream=mock.url, on_session=record, monitor_id="it")
        port = await proxy.start("127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for i in range(12):
                model = "qwen2.5:0.5b" if i % 3 else "llama3.1:8b"
                async with client.stream(
                    "POST", "/api/generate", json={"model": model, "prompt": f"q{i}"}
                ) as r:
                    lines = [json.loads(line) async for line in r.aiter_lines() if line]
                assert lines[-1]["done"] is True
                assert len(lines) > 2
            await client.post("/api/chat", json={"model": "ghost:1b", "messages": []})
            monitor.publish(await poll_ollama(client, mock.url, "it"))
        await proxy.close()

    try:
        asyncio.run(asyncio.wait_for(traffic(), 120))
    finally:
        mock.stop()
    assert producer.flush(30) == 0
    wait_until(lambda: count(migrated, "SELECT count(*) FROM llm_sessions") == 13, 60, "13 sessions stored")
    wait_until(
        lambda: count(migrated, "SELECT count(*) FROM llm_server_status") == 1, 60, "the server snapshot"
    )

    models = {m["model"]: m for m in api.get("/api/v1/llm/models").json()["models"]}
    assert set(models) == {"qwen2.5:0.5b", "llama3.1:8b", "ghost:1b"}
    for name, row in models.items():
        mine = [s for s in seen if s.model == name]
        assert row["requests"] == len(mine)
        assert row["errors"] == sum(not s.ok for s in mine)
        ttft = [s.ttft_ms for s in mine if s.ttft_ms is not None]
        tps = [s.tokens_per_s for s in mine if s.tokens_per_s is not None]
        if ttft:  # percentile_cont is linear interpolation, as numpy's default
            assert row["ttft_p50_ms"] == pytest.approx(float(np.percentile(ttft, 50)))
            assert row["ttft_p95_ms"] == pytest.approx(float(np.percentile(ttft, 95)))
            assert row["tps_p50"] == pytest.approx(statistics.median(tps))
            assert row["tps_p95"] == pytest.approx(float(np.percentile(tps, 95)))
    assert models["ghost:1b"]["errors"] == 1
    assert models["ghost:1b"]["ttft_p50_ms"] is None
    (server,) = api.get("/api/v1/llm/servers").json()["servers"]
    assert server["up"]
    assert server["version"] == "0.6.8"
    assert {m["name"] for m in server["models"]} == {"qwen2.5:0.5b", "llama3.1:8b"}
    assert all(m["vram_bytes"] > 0 for m in server["models"])
    assert api.get("/api/v1/llm/models?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z").status_code == 400


def test_bad_workload_records_are_dead_lettered_and_the_good_ones_stored_once(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topics: TopicSettings,
    sink: WorkloadLoop,
) -> None:
    good = GpuProcesses(
        time=datetime.now(UTC),
        source="nvml",
        collector_id="c",
        hostname="h",
        gpu_uuid="GPU-8b08f602-b857-81e9-a86b-547a202d628f",
        gpu_index=0,
        processes=[
            GpuProcess(
                pid=42,
                type="compute",
                used_memory_mib=100,
                classification=ProcessClass.TRAINING,
                rule="training-script",
            )
        ],
    )
    value = json.dumps(to_json(good)).encode()
    producer = make_producer(kafka_settings)
    bad = [
        (topics.processes, b"GPU-8b08f602-b857-81e9-a86b-547a202d628f", b"{not json"),
        (
            topics.processes,
            b"GPU-8b08f602-b857-81e9-a86b-547a202d628f",
            value.replace(b'"training"', b'"mining"'),
        ),
        (topics.processes, b"GPU-ffffffff-b857-81e9-a86b-547a202d628f", value),  # key is another GPU
        (topics.llm_sessions, b"s", b'{"kind":"session","schema_version":1,"model":"m"}'),
        (topics.llm_sessions, b"s", b'{"kind":"gossip"}'),
        (topics.llm_sessions, b"s", None),
    ]
    for topic, key, raw in [
        *bad[:3],
        (topics.processes, good.gpu_uuid.encode(), value),
        *bad[3:],
        (topics.processes, good.gpu_uuid.encode(), value),
    ]:
        producer.produce(topic, key=key, value=raw)
    assert producer.flush(30) == 0
    dead = consume_all(kafka_settings, topics.dead_letters, expected=len(bad), timeout_s=60)
    assert len(dead) == len(bad)
    headers = [header_map(m) for m in dead]
    assert {h["dlq.category"] for h in headers} == {"contract", "key", "empty"}
    assert all(
        h["dlq.source.topic"] in (topics.processes, topics.llm_sessions) and h["dlq.error"] for h in headers
    )
    # every record of the processes topic (3 bad, the good one twice) is behind the stored offsets
    stored = f"SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets WHERE topic = '{topics.processes}'"
    wait_until(lambda: count(migrated, stored) == 5, 60, "all of the processes topic consumed")
    assert count(migrated, "SELECT count(*) FROM gpu_processes") == 1
    assert count(migrated, "SELECT count(*) FROM gpu_process_polls") == 1  # sent twice, stored once
    assert not sink.failed  # the loop is still running: bad records stopped nothing


def _serve_vllm_metrics() -> ThreadingHTTPServer:
    """A stand-in vLLM whose /metrics alternates between two recorded scrapes."""
    data = DATA
    scrapes = [(data / f"vllm-metrics-{i}.txt").read_bytes() for i in (1, 2)]
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = scrapes[served[0] % 2]
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_monitor_and_mock_ollama_run_as_services_probe_serve_metrics_and_stop_cleanly(
    kafka_settings: KafkaSettings, topics: TopicSettings
) -> None:
    ollama_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    vllm = _serve_vllm_metrics()
    vllm_url = f"http://127.0.0.1:{vllm.server_address[1]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GPUHEALTH_LOG__JSON": "false",
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_TOPICS__LLM_SESSIONS": topics.llm_sessions,
        "GPUHEALTH_MOCK_OLLAMA__PORT": str(ollama_port),
        "GPUHEALTH_MOCK_OLLAMA__TIME_SCALE": "0.01",
        "GPUHEALTH_LLM__OLLAMA_URL": f"http://127.0.0.1:{ollama_port}",
        "GPUHEALTH_LLM__LISTEN_PORT": str(proxy_port),
        "GPUHEALTH_LLM__METRICS_PORT": str(metrics_port),
        "GPUHEALTH_LLM__PROBE_MODEL": "qwen2.5:0.5b",
        "GPUHEALTH_LLM__POLL_INTERVAL_S": "1",
        "GPUHEALTH_LLM__VLLM_URLS": json.dumps([vllm_url]),
    }
    mock = subprocess.Popen([sys.executable, "-m", "services.mock_ollama"], env=env, cwd=REPO)
    monitor = subprocess.Popen([sys.executable, "-m", "services.llm_monitor"], env=env, cwd=REPO)
    try:

        def answers(url: str) -> bool:
            try:
                return VIEWER.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(
            lambda: answers(f"http://127.0.0.1:{proxy_port}/api/version"),
            60,
            "the proxy in front of the mock",
        )
        r = httpx.post(
            f"http://127.0.0.1:{proxy_port}/api/generate",
            json={"model": "mistral:7b", "prompt": "x"},
            timeout=30,
        )
        assert r.status_code == 200
        assert r.text.strip().splitlines()[-1].startswith("{")
        kinds: dict[str, set[str]] = {}
        vllm_ttft: list[float] = []

        def seen_all() -> bool:
            for m in consume_all(kafka_settings, topics.llm_sessions, expected=1000, timeout_s=2):
                v = json.loads(m.value() or b"{}")
                kinds.setdefault(v["kind"], set()).add(v.get("source") or v["engine"])
                if v.get("engine") == "vllm" and v["kind"] == "server" and v["ttft_ms"] is not None:
                    vllm_ttft.append(v["ttft_ms"])
            sessions, servers = kinds.get("session", set()), kinds.get("server", set())
            return sessions >= {"proxy", "probe"} and servers >= {"ollama", "vllm"} and bool(vllm_ttft)

        wait_until(seen_all, 90, "a proxied session, a probe, Ollama and vLLM snapshots on llm-sessions")
        # the stand-in vLLM alternates two recorded scrapes: 20 requests and 1.5 s of TTFT between them
        assert vllm_ttft[0] == pytest.approx(75.0)
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert 'gpuhealth_llm_sessions_total{ok="true",source="probe"}' in metrics
        assert f'gpuhealth_llm_server_up{{server="http://127.0.0.1:{ollama_port}"}} 1.0' in metrics
    finally:
        for process in (monitor, mock):
            process.send_signal(signal.SIGTERM)
        vllm.shutdown()
    assert monitor.wait(30) == 0
    assert mock.wait(30) == 0


def test_workload_retention_drops_only_old_chunks(migrated: DatabaseSettings) -> None:
    from services.sink.workload import WorkloadRetention

    old, recent = datetime.now(UTC) - timedelta(days=45), datetime.now(UTC) - timedelta(hours=1)
    with connect(migrated) as conn:
        for t in (old, recent):
            conn.execute(
                "INSERT INTO gpu_process_polls (time, gpu_uuid, gpu_index, hostname, collector_id, source,"
                " process_count) VALUES (%s, 'GPU-8b08f602-b857', 0, 'h', 'c', 'nvml', 0)",
                (t,),
            )
        conn.commit()
    writer = WorkloadRetention(migrated)
    try:
        assert writer.drop_old_chunks({"gpu_process_polls": 30, "llm_sessions": 90})["gpu_process_polls"] == 1
    finally:
        writer.close()
    assert count(migrated, "SELECT count(*) FROM gpu_process_polls") == 1
    assert (
        count(migrated, "SELECT count(*) FROM gpu_process_polls WHERE time > now() - interval '1 day'") == 1
    )

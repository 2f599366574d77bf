"""The README's walk-through, a fault becoming an alert, runs as written against the whole pipeline.

The block marked `<!-- runnable against the pipeline -->` injects a fault through the mock fleet's admin
endpoint and waits for the alert through the API and the CLI. Here the pipeline is the real services, each
`python -m services.<name>` as `make up` starts them, on the test's own topics, schema and ports; the
only rewrites are those addresses, and the collector and scorer run faster than `make up`'s.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.identities import api_env, identities
from tests.helpers.kafka import kafka_env
from tests.helpers.ports import free_ports
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO

WALK = re.compile(r"^<!-- runnable against the pipeline -->\n```sh\n(.*?)^```", re.M | re.S)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def pipeline(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> Iterator[dict[str, int]]:
    """Mock fleet (2 nodes × 4 GPUs), collector, sink, scorer and API, each its own process."""
    node0, node1, admin, api, collector_metrics, sink_metrics, scorer_metrics = free_ports(7)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "OTEL_"))}
    run = uuid.uuid4().hex[:12]
    common = clean | {
        "PYTHONPATH": str(REPO),
        **kafka_env(kafka_settings),
        "GPUHEALTH_DB__HOST": migrated.host,
        "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
        # each service its own group, new to Kafka: a sink and scorer that share one split the events
        # topic's partitions between them, and the scorer never judges the GPUs of the sink's share
        "GPUHEALTH_SINK__GROUP_ID": f"sink-{run}",
        "GPUHEALTH_SCORER__GROUP": f"scorer-{run}",
        **topics_env(isolated_topics(topic_factory)),  # every topic the registry has, the test's own
    }
    services = {
        "mock_dcgm": {"GPUHEALTH_MOCK__NODES": "2", "GPUHEALTH_MOCK__GPUS_PER_NODE": "4",
                      "GPUHEALTH_MOCK__BASE_PORT": str(node0), "GPUHEALTH_MOCK__ADMIN_PORT": str(admin)},
        "collector": {"GPUHEALTH_COLLECTOR__SOURCE": "mock", "GPUHEALTH_COLLECTOR__INTERVAL_S": "2",
                      "GPUHEALTH_COLLECTOR__DCGM_URLS":
                          f'["http://127.0.0.1:{node0}/metrics","http://127.0.0.1:{node1}/metrics"]',
                      "GPUHEALTH_COLLECTOR__METRICS_PORT": str(collector_metrics)},
        "sink": {"GPUHEALTH_SINK__METRICS_PORT": str(sink_metrics)},
        "scorer": {"GPUHEALTH_SCORER__INTERVAL_S": "3",
                   "GPUHEALTH_SCORER__METRICS_PORT": str(scorer_metrics)},
        "api": {"GPUHEALTH_API__PORT": str(api), **api_env()},
    }  # fmt: skip
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, env in services.items():
            with (tmp_path / f"{name}.log").open("wb") as log:
                command = [sys.executable, "-m", f"services.{name}"]
                running[name] = subprocess.Popen(command, cwd=REPO, env=common | env,
                                                 stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 60
        ready = (f"http://127.0.0.1:{admin}/healthz", f"http://127.0.0.1:{api}/readyz")
        while not all(answers(url) for url in ready):
            dead = {n: p.returncode for n, p in running.items() if p.poll() is not None}
            assert not dead, f"exited: {dead}; logs in {tmp_path}"
            assert time.monotonic() < deadline, f"the pipeline did not start; logs in {tmp_path}"
            time.sleep(0.5)
        yield {"admin": admin, "api": api}
    finally:
        for proc in running.values():
            proc.send_signal(signal.SIGTERM)
        for proc in running.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_the_readme_marks_its_walk_through() -> None:
    blocks = WALK.findall((REPO / "README.md").read_text())
    assert len(blocks) == 1
    assert "localhost:9399/faults" in blocks[0]
    assert "gpuhealth alerts" in blocks[0]


@pytest.mark.timeout(420)
def test_a_fault_becomes_an_alert_as_the_readme_says(pipeline: dict[str, int]) -> None:
    (block,) = WALK.findall((REPO / "README.md").read_text())
    script = (
        block.replace("localhost:9399", f"localhost:{pipeline['admin']}")
        .replace("localhost:8000", f"localhost:{pipeline['api']}")
        .replace("~/.cache/gpu-health/venv/bin/", str(Path(sys.executable).parent) + "/")
        .replace("~/.cache/gpu-health/run/auth/", f"{identities().directory}/")
        .replace("$HOME/.cache/gpu-health/run/auth/", f"{identities().directory}/")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUHEALTH_URL")}
    env["GPUHEALTH_URL"] = f"http://127.0.0.1:{pipeline['api']}"
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert run.returncode == 0, f"--- stderr:\n{run.stderr}\n--- stdout:\n{run.stdout}"
    assert "memory: volatile_dbe" in run.stdout  # the CLI lists the alert
    assert "gpu-node-01" in run.stdout  # with its host
    assert '"kind": "dbe"' in run.stdout.replace('"kind":"dbe"', '"kind": "dbe"')  # the ground truth

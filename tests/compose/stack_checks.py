"""Checks on a running `docker compose` stack, from the host (run by `make compose-test`).

Not collected by `make test` (the name does not start with ``test_``): it needs the
stack that scripts/compose-test.sh brought up, and names it through
GPUHEALTH_COMPOSE_PROJECT / GPUHEALTH_COMPOSE_FILES. Host addresses come from
`docker compose port`, so the checks follow whatever ports the override publishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest

from shared.settings.common import Settings
from tests.helpers.image_files import SERVICE_SETTINGS, ImageFiles, app_image_misses
from tests.paths import REPO

DOCKER = os.environ.get("DOCKER", "docker")
PROJECT = os.environ.get("GPUHEALTH_COMPOSE_PROJECT", "gpu-health-compose-test")
FILES = os.environ.get("GPUHEALTH_COMPOSE_FILES", "docker-compose.yml:deploy/docker/compose.local-images.yml")
T = TypeVar("T")


def compose(*args: str, timeout: float = 120) -> str:
    command = [DOCKER, "compose", "-p", PROJECT]
    for f in FILES.split(":"):
        command += ["-f", str(REPO / f)]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )
    assert done.returncode == 0, f"docker compose {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 2.0) -> T:
    """Polls `probe` until it returns something other than None; fails with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if (found := probe()) is not None:
                return found
        except (httpx.HTTPError, ValueError, KeyError) as e:
            last = e
        time.sleep(every_s)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s (last error: {last})", pytrace=False)


def viewer() -> dict[str, str]:
    """A viewer's token, from the API container's local issuer (docker-compose.yml's api)."""
    token = compose("exec", "-T", "api", "cat", "/auth/viewer.token").strip()
    return {"Authorization": f"Bearer {token}"}


def url(service: str, port: int) -> str:
    host_port = compose("port", service, str(port)).strip()
    assert host_port, f"{service}:{port} is not published"
    return f"http://{host_port}"


@pytest.fixture(scope="module")
def fleet() -> dict[str, Any]:
    inventory: dict[str, Any] = httpx.get(f"{url('mock', 9399)}/fleet", timeout=10).json()
    return inventory


def mock_gpus(fleet: dict[str, Any]) -> list[str]:
    return [gpu["uuid"] for node in fleet["nodes"] for gpu in node["gpus"]]


def test_every_service_is_healthy_or_completed() -> None:
    expected = set(compose("config", "--services").split())
    states = {}
    for line in compose("ps", "--all", "--format", "json").splitlines():
        container = json.loads(line)
        states[container["Service"]] = container
    assert set(states) == expected, f"services without a container: {expected - set(states)}"
    for service, c in states.items():
        healthy = c["State"] == "running" and c["Health"] == "healthy"
        completed = c["State"] == "exited" and c["ExitCode"] == 0
        assert healthy or completed, f"{service}: {c['State']} {c['Health']} exit {c['ExitCode']}"
    assert states["setup"]["State"] == "exited", "the one-shot setup is still running"


def test_every_service_finds_its_command_settings_and_mounts_in_its_container() -> None:
    # The unit test reads the Dockerfile; this asks the image that really runs.
    services = json.loads(compose("config", "--format", "json"))["services"]
    app = {name: s for name, s in services.items() if "build" in s}
    assert len({s["image"] for s in app.values()}) == 1, "the app services run one image"
    listing = compose("exec", "-T", "api", "find", "/app", "-type", "f").split()
    files = ImageFiles("/app", frozenset(listing))
    for name, service in app.items():
        misses = app_image_misses(service, SERVICE_SETTINGS.get(name, Settings), files, REPO)
        assert not misses, f"{name}: its container lacks {misses}"
    running = set(compose("ps", "--services", "--status", "running").split())
    for name, service in services.items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind" and name in running:
                compose("exec", "-T", name, "test", "-e", volume["target"])


def test_the_api_counts_every_mock_gpu_with_a_verdict(fleet: dict[str, Any]) -> None:
    gpus = mock_gpus(fleet)
    assert len(gpus) == 32, f"the compose mock fleet should have 4 x 8 GPUs, has {len(gpus)}"
    api = url("api", 8000)

    def scored() -> dict[str, Any] | None:
        summary: dict[str, Any] = httpx.get(
            f"{api}/api/v1/fleet/summary", headers=viewer(), timeout=10
        ).json()
        return summary if summary["gpus"] == len(gpus) and summary["not_scored"] == 0 else None

    summary = wait_for("every mock GPU counted and scored by the API", scored, timeout_s=240)
    assert summary["healthy"] + summary["degraded"] + summary["unhealthy"] == len(gpus)
    listed = httpx.get(f"{api}/api/v1/gpus", params={"limit": 1000}, headers=viewer(), timeout=10).json()
    assert {g["gpu_uuid"] for g in listed["gpus"]} == set(gpus)


def test_an_injected_fault_becomes_an_open_alert(fleet: dict[str, Any]) -> None:
    injected = httpx.post(
        f"{url('mock', 9399)}/faults", json={"kind": "dbe", "node": 1, "gpu": 2}, timeout=10
    )
    assert injected.status_code == 201, injected.text
    gpu_uuid = injected.json()["gpu_uuid"]
    assert gpu_uuid in mock_gpus(fleet)
    api = url("api", 8000)

    def alert() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = httpx.get(
            f"{api}/api/v1/alerts", params={"state": "open", "gpu": gpu_uuid}, headers=viewer(), timeout=10
        ).json()["alerts"]
        return found or None

    alerts = wait_for(f"an open alert for {gpu_uuid}", alert, timeout_s=240)
    assert any(a["severity"] == "critical" for a in alerts), alerts


def test_kafka_console_consumer_in_the_kafka_container_reads_a_sample() -> None:
    out = compose(
        "exec", "-T", "kafka", "/opt/kafka/bin/kafka-console-consumer.sh",
        "--bootstrap-server", "kafka:29092", "--command-config", "/tls/broker.properties",
        "--topic", "gpu-metrics-raw", "--from-beginning",
        "--max-messages", "1", "--timeout-ms", "60000", timeout=120,
    )  # fmt: skip
    sample = json.loads(out.strip().splitlines()[-1])
    assert sample["gpu_uuid"].startswith("GPU-")
    assert sample["source"] == "mock"
    assert "schema_version" in sample


# One record to gpu-health with the container's own Kafka settings; prints "written" or the error's name.
PROBE = """
import confluent_kafka
from shared.settings.common import Settings
from shared.plumbing.kafka import client_config
out = []
quiet = {"message.timeout.ms": 10000, "log_level": 0, "error_cb": lambda e: None}
producer = confluent_kafka.Producer(client_config(Settings().kafka) | quiet)
producer.produce("gpu-health", b"{}", key=b"GPU-compose-check", on_delivery=lambda err, msg: out.append(err))
producer.flush(20)
print("written" if out and out[0] is None else out[0].name() if out else "no report")
"""


def test_kafka_refuses_verdicts_from_a_collector_and_from_anyone_without_a_certificate() -> None:
    as_collector = compose("exec", "-T", "collector-0", "python", "-c", PROBE, timeout=60)
    assert as_collector.strip().splitlines()[-1] == "TOPIC_AUTHORIZATION_FAILED", as_collector
    no_certificate = (
        "-e",
        "GPUHEALTH_KAFKA__SSL_CERTIFICATE_LOCATION=",
        "-e",
        "GPUHEALTH_KAFKA__SSL_KEY_LOCATION=",
    )
    anonymous = compose("exec", "-T", *no_certificate, "collector-0", "python", "-c", PROBE, timeout=60)
    assert anonymous.strip().splitlines()[-1] == "_MSG_TIMED_OUT", anonymous


def psql(query: str) -> str:
    return compose(
        "exec", "-T", "timescaledb", "psql", "-X", "-At", "-v", "ON_ERROR_STOP=1",
        "-U", "gpuhealth", "-d", "gpu_health", "-c", query,
    ).strip()  # fmt: skip


def test_psql_in_the_database_container_queries_a_hypertable() -> None:
    hypertables = psql("SELECT hypertable_name FROM timescaledb_information.hypertables").split()
    assert "gpu_metrics" in hypertables
    rows, gpus = psql("SELECT count(*), count(DISTINCT gpu_uuid) FROM gpu_metrics").split("|")
    assert int(rows) > 0
    assert int(gpus) == 32


def test_the_image_init_scripts_and_the_mounted_one_both_ran() -> None:
    # The image's own init script set telemetry from TIMESCALEDB_TELEMETRY; the compose
    # file's one file beside it created the API's read-only login.
    assert psql("SHOW timescaledb.telemetry_level") == "off"
    assert psql("SELECT count(*) FROM pg_roles WHERE rolname = 'gpuhealth_reader' AND rolcanlogin") == "1"


def test_the_scorer_and_remediator_are_connected_as_their_own_logins() -> None:
    """Each named by its application_name, as its own login (schema/0084), not the owner: both keep a
    connection open while they run; the lifecycle's, when one is open, is checked too."""
    names = "('gpu-health-scorer', 'gpu-health-remediator', 'gpu-health-lifecycle')"

    def logins() -> set[tuple[str, str]] | None:
        found = psql(
            "SELECT DISTINCT application_name || '=' || usename FROM pg_stat_activity"
            f" WHERE application_name IN {names}"
        ).split()
        seen = {(name, user) for name, user in (entry.split("=") for entry in found)}
        return seen if {"gpu-health-scorer", "gpu-health-remediator"} <= {n for n, _ in seen} else None

    seen = wait_for("the scorer's and remediator's connections", logins, timeout_s=60)
    assert seen == {(name, "gpuhealth_" + name.removeprefix("gpu-health-")) for name, _ in seen}


def test_prometheus_scrapes_the_node_exporters_and_no_absent_dcgm_exporter() -> None:
    prometheus = url("prometheus", 9090)

    def targets() -> list[dict[str, Any]] | None:
        active: list[dict[str, Any]] = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"][
            "activeTargets"
        ]
        nodes = [t for t in active if t["labels"]["job"] == "dcgm"]
        return active if len(nodes) == 4 and all(t["health"] == "up" for t in nodes) else None

    active = wait_for("prometheus scraping the 4 node exporters", targets, timeout_s=120)
    absent = [t for t in active if t["labels"]["job"] == "dcgm_exporter"]
    assert not absent, "dcgm-exporter scraped without its profile"
    series = httpx.get(
        f"{prometheus}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_TEMP)"}, timeout=10
    ).json()["data"]["result"]
    assert series, "no DCGM series in Prometheus"
    assert int(series[0]["value"][1]) == 32

"""The mock fleet over real HTTP: scrape nodes, inject and clear faults, read the ground truth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evaluation.pipeline import wait_until
from services.mock_dcgm.fleet import Fleet
from services.mock_dcgm.server import MockServer
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.ports import free_port
from tests.paths import REPO


@pytest.fixture
def running() -> Iterator[tuple[Fleet, MockServer]]:
    with served_fleet(nodes=2, gpus=4, seed=3, speed=60, timestamps=True) as served:
        yield served


def test_scrape_inject_clear_and_ground_truth(running: tuple[Fleet, MockServer]) -> None:
    fleet, server = running
    with httpx.Client(timeout=10) as http:
        page = http.get(server.node_url(1))
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(page.text)}
        temps = families["DCGM_FI_DEV_GPU_TEMP"].samples
        assert len(temps) == 4
        assert {s.labels["Hostname"] for s in temps} == {"gpu-node-01"}
        assert all(s.timestamp is not None for s in temps)  # accelerated clock: stamped

        target = fleet.nodes[1].gpus[2].uuid
        made = http.post(f"{server.admin_url}/faults", json={"kind": "fall_off_bus", "gpu_uuid": target})
        assert made.status_code == 201, made.text
        assert target not in http.get(server.node_url(1)).text

        truth = http.get(f"{server.admin_url}/ground-truth").json()
        assert [(f["kind"], f["gpu_uuid"], f["active"]) for f in truth["faults"]] == [
            ("fall_off_bus", target, True)
        ]
        cleared = http.delete(f"{server.admin_url}/faults/{made.json()['id']}")
        assert cleared.status_code == 200
        assert target in http.get(server.node_url(1)).text
        assert http.get(f"{server.admin_url}/ground-truth").json()["faults"][0]["active"] is False

        fleet_doc = http.get(f"{server.admin_url}/fleet").json()
        assert [n["metrics_url"] for n in fleet_doc["nodes"]] == [
            server.node_url(0),
            server.node_url(1),
        ]
        own = http.get(f"{server.admin_url}/metrics").text
        assert 'gpuhealth_mock_scrapes_total{node="1"}' in own
        assert "gpuhealth_mock_faults_injected_total" in own


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"{not json", {}, 400, "not JSON"),
        (b"\xff\xfe", {}, 400, "not JSON"),
        (b'{"kind": "xid", "node": 0, "gpu": 99}', {}, 400, "gpu must be"),
        (b'{"kind": "<script>", "node": 0, "gpu": 0}', {}, 400, "unknown fault kind"),
        (b"x" * (64 * 1024 + 1), {}, 413, "body must be"),
    ],
)
def test_hostile_admin_requests_get_clear_4xx(
    running: tuple[Fleet, MockServer],
    body: bytes,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    fleet, server = running
    reply = httpx.post(f"{server.admin_url}/faults", content=body, headers=headers, timeout=10)
    assert reply.status_code == status
    assert message in reply.json()["error"]
    assert fleet.ground_truth()["faults"] == []
    assert httpx.get(f"{server.admin_url}/nope", timeout=10).status_code == 404
    assert httpx.delete(f"{server.admin_url}/faults/999", timeout=10).status_code == 404


def test_the_service_starts_serves_and_exits_zero_on_sigterm() -> None:
    node_port, admin_port = free_port(), free_port()
    env = {
        **os.environ,
        "GPUHEALTH_MOCK__NODES": "1",
        "GPUHEALTH_MOCK__BASE_PORT": str(node_port),
        "GPUHEALTH_MOCK__ADMIN_PORT": str(admin_port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.mock_dcgm"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{admin_port}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answers, 20, "the mock to start")
        assert "DCGM_FI_DEV_GPU_TEMP" in httpx.get(f"http://127.0.0.1:{node_port}/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()

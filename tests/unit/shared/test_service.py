"""A port already taken is reported with the port and what it was for, not a bare "Address already in use"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from services.mock_dcgm.server import MockServer
from shared.plumbing.service import named_on_the_database, serve_metrics
from shared.settings.common import DatabaseSettings, Settings
from tests.helpers.mock_fleet import make_fleet
from tests.helpers.ports import free_ports
from tests.paths import REPO


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_metrics_port_in_use_names_the_port(taken: int) -> None:
    with pytest.raises(
        OSError, match=rf"cannot serve /metrics on 127\.0\.0\.1:{taken}: Address already in use"
    ):
        serve_metrics(CollectorRegistry(), taken, "127.0.0.1")


@pytest.mark.parametrize("node", [0, 2, 3])
def test_mock_node_port_in_use_names_the_port_and_gives_the_others_back(node: int) -> None:
    base = free_ports(4)[0]
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + node))
        blocker.listen()
        fleet, _ = make_fleet(nodes=4, gpus=1)
        with pytest.raises(OSError, match=rf"127\.0\.0\.1:{base + node} for node {node}'s exporter"):
            MockServer(fleet, bind="127.0.0.1", base_port=base, admin_port=0, timestamps=False)
        for i in range(node):  # the ports opened before the failure are free again
            with socket.socket() as again:
                again.bind(("127.0.0.1", base + i))


def test_the_mock_process_says_which_admin_port_is_taken(taken: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUHEALTH_LOG__JSON": "false",
           "GPUHEALTH_MOCK__BASE_PORT": "0", "GPUHEALTH_MOCK__ADMIN_PORT": str(taken)}  # fmt: skip
    command = [sys.executable, "-m", "services.mock_dcgm"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert (
        f"cannot listen on 127.0.0.1:{taken} for the admin API: Address already in use"
        in out.stderr + out.stdout
    )


def test_a_service_names_its_connections_unless_told_otherwise() -> None:
    named = named_on_the_database(Settings(db=DatabaseSettings()), "remediator")
    assert named.db.application_name == "gpu-health-remediator"
    assert "application_name='gpu-health-remediator'" in named.db.conninfo()
    chosen = named_on_the_database(Settings(db=DatabaseSettings(application_name="fleet-a")), "scorer")
    assert chosen.db.application_name == "fleet-a"

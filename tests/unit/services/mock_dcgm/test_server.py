"""MockServer as a resource: closing before start does not hang, closing twice is safe, run(stop) stops."""

from __future__ import annotations

import time

from services.mock_dcgm.fleet import Fleet, FleetSpec, SimClock
from services.mock_dcgm.server import MockServer
from tests.helpers.service_process import serves_until_stopped


def server() -> MockServer:
    fleet = Fleet(FleetSpec(nodes=1, gpus_per_node=1, seed=3), SimClock(start_s=time.time()))
    return MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False)


def test_a_server_never_started_closes_at_once_and_twice() -> None:
    with server() as mock:
        pass
    mock.stop()


def test_run_serves_until_stop_and_then_gives_the_ports_back() -> None:
    with server() as mock:
        serves_until_stopped(mock.run, f"{mock.admin_url}/healthz")
        assert all(s.socket.fileno() == -1 for s in mock.servers)

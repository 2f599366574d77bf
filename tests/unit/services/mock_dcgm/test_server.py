"""MockServer as a resource (closing before start does not hang, closing twice is safe, run(stop) stops), and
its admin API's route table, route by route."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from services.mock_dcgm import server as srv
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
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


def admin() -> srv.Admin:
    fleet = Fleet(FleetSpec(nodes=1, gpus_per_node=2, seed=3), SimClock(start_s=time.time()))
    registry = CollectorRegistry()
    return srv.Admin(fleet, srv.MockMetrics(registry, fleet), registry, lambda i: f"http://node{i}/metrics")


def refused(route: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(srv.RefusedError) as e:
        route()
    return e.value.status, str(e.value)


def test_the_admin_routes_are_one_table_per_method_and_unknown_paths_are_refused() -> None:
    a = admin()
    assert srv.route(srv.GETS, "/healthz", "")(a) == srv.Reply(200, b"ok\n", "text/plain")
    assert srv.GETS["/fleet"](a).body["nodes"][0]["metrics_url"] == "http://node0/metrics"
    assert b"gpuhealth_mock_gpus 2.0" in srv.GETS["/metrics"](a).body
    assert srv.GETS["/ground-truth"](a).body["faults"] == []
    assert srv.POST_WHERE == "POST goes to /faults, /compute-check, /repairs, /reset-gpu or /reboot"
    assert refused(lambda: srv.route(srv.POSTS, "/faults?x=1", srv.POST_WHERE)) == (404, srv.POST_WHERE)


def test_a_fault_is_injected_checked_reset_and_cleared_through_its_routes() -> None:
    a = admin()
    gpu, other = (g.uuid for g in a.fleet.nodes[0].gpus)
    made = srv.POSTS["/faults"](a, {"kind": "fall_off_bus", "gpu_uuid": gpu})
    assert made.status == 201
    assert made.body["active"] is True
    assert srv.POSTS["/compute-check"](a, {"gpu_uuid": f"{gpu},{other}"}).status == 409
    assert srv.POSTS["/compute-check"](a, {"gpu_uuid": other}).status == 200
    assert refused(lambda: srv.POSTS["/compute-check"](a, [gpu]))[0] == 400
    assert refused(lambda: srv.POSTS["/compute-check"](a, {"gpu_uuid": "GPU-x"}))[0] == 404
    assert refused(lambda: srv.POSTS["/reset-gpu"](a, {"gpu_uuid": gpu}))[0] == 409  # off the bus
    assert srv.POSTS["/reset-gpu"](a, {"gpu_uuid": other}).body["ok"] is True
    assert refused(lambda: srv.POSTS["/reboot"](a, "x"))[0] == 400
    assert srv.POSTS["/repairs"](a, {"gpu_uuid": other}).status == 201
    assert refused(lambda: srv.POSTS["/repairs"](a, {}))[0] == 400
    assert refused(lambda: srv.POSTS["/faults"](a, {"kind": "nope", "gpu_uuid": gpu}))[0] == 400
    assert srv.clear(a, f"/faults/{made.body['id']}").body["active"] is False
    assert refused(lambda: srv.clear(a, "/faults/999")) == (404, "no fault with id 999")
    assert refused(lambda: srv.clear(a, "/faults/x")) == (404, "DELETE goes to /faults/<id>")

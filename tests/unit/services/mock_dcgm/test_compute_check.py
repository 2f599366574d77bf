"""The mock fleet's compute check (POST /compute-check), which the remediator's validation asks through its
exec driver's webhook: a GPU fails while a fault the setting counts is active on it, and passes once the
fault ends; what a caller sends that is not a check gets a clear 4xx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import ComputeCheck, Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from tests.helpers.mock_fleet import GPU, H100, make_fleet


def faulted(kind: str, params: dict[str, float] | None = None) -> tuple[Fleet, str, int]:
    """A fleet with `kind` active on one GPU: the fleet, the GPU's UUID, the fault's id."""
    fleet, hand = make_fleet()
    fault = fleet.inject({"kind": kind, "node": H100, "gpu": GPU, "params": params or {}})
    hand.t = 120
    return fleet, fleet.nodes[H100].gpus[GPU].uuid, fault.id


@pytest.mark.parametrize(
    ("kind", "params", "fails_on", "passed"),
    [
        ("dbe", None, "hard_failure", False),
        ("xid", {"code": 79}, "hard_failure", False),
        ("xid", {"code": 13}, "hard_failure", True),  # an application XID: the GPU computes
        ("sbe_storm", None, "hard_failure", True),  # a precursor: not yet a failure
        ("sbe_storm", None, "any_fault", False),
        ("heavy_workload", None, "any_fault", True),  # hot but healthy
        ("dbe", None, "nothing", True),
    ],
)
def test_a_gpu_fails_while_a_fault_the_setting_counts_is_active(
    kind: str, params: dict[str, float] | None, fails_on: ComputeCheck, passed: bool
) -> None:
    fleet, uuid, fault_id = faulted(kind, params)
    answer = fleet.compute_check([uuid], fails_on)
    assert answer["passed"] is passed
    (gpu,) = answer["gpus"]
    assert (gpu["gpu_uuid"], gpu["hostname"], gpu["passed"]) == (uuid, "gpu-node-00", passed)
    assert gpu["faults"] == ([] if passed else [{"id": fault_id, "kind": kind}])


def test_the_check_passes_once_the_fault_is_cleared_and_other_gpus_never_fail() -> None:
    fleet, uuid, fault_id = faulted("fall_off_bus")
    neighbour = fleet.nodes[H100].gpus[GPU - 1].uuid
    answer = fleet.compute_check([neighbour, uuid], "hard_failure")
    assert [g["passed"] for g in answer["gpus"]] == [True, False]
    assert answer["passed"] is False
    fleet.clear(fault_id)
    assert fleet.compute_check([neighbour, uuid], "hard_failure")["passed"] is True


def served(fails_on: ComputeCheck = "hard_failure") -> tuple[Fleet, MockServer]:
    fleet = Fleet(FleetSpec(nodes=1, gpus_per_node=2, seed=3), SimClock(start_s=time.time()))
    server = MockServer(
        fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False, compute_check=fails_on
    )
    server.start()
    return fleet, server


def test_the_webhook_answers_200_when_every_gpu_passes_and_409_naming_the_fault_when_one_fails() -> None:
    fleet, server = served()
    with server:
        good, bad = (g.uuid for g in fleet.nodes[0].gpus)
        fault = fleet.inject({"kind": "dbe", "gpu_uuid": bad})
        url = f"{server.admin_url}/compute-check"
        body = {"operation": "compute_check", "node": "gpu-node-00", "plan_id": "1", "gpu_index": "0"}
        assert httpx.post(url, json={**body, "gpu_uuid": good}, timeout=10).status_code == 200
        failed = httpx.post(url, json={**body, "gpu_uuid": bad}, timeout=10)
        assert failed.status_code == 409
        assert failed.json()["gpus"][0]["faults"] == [{"id": fault.id, "kind": "dbe"}]
        both = httpx.post(url, json={**body, "gpu_uuid": f"{good},{bad}"}, timeout=10)  # once per node
        assert both.status_code == 409
        assert [g["passed"] for g in both.json()["gpus"]] == [True, False]


@pytest.fixture(scope="module")
def served_fleet() -> Iterator[tuple[Fleet, MockServer]]:
    fleet, server = served()
    with server:
        yield fleet, server


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.one_of(
        st.binary(max_size=64),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
            ),
            max_leaves=8,
        ).map(lambda v: json.dumps(v).encode()),
        st.text(max_size=40).map(lambda uuid: json.dumps({"gpu_uuid": uuid}).encode()),
    )
)
def test_what_is_not_a_check_gets_a_clear_4xx_and_never_a_pass(
    served_fleet: tuple[Fleet, MockServer], body: bytes
) -> None:
    fleet, server = served_fleet
    uuids = {g.uuid for g in fleet.nodes[0].gpus}
    reply = httpx.post(f"{server.admin_url}/compute-check", content=body, timeout=10)
    try:
        sent = json.loads(body)
    except ValueError:
        sent = None
    asked = sent.get("gpu_uuid") if isinstance(sent, dict) else None
    if isinstance(asked, str) and asked and set(asked.split(",")) <= uuids:
        assert reply.status_code == 200
    else:
        assert 400 <= reply.status_code < 500, reply.text
        assert reply.json()["error"]

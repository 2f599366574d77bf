"""Remedies on the mock fleet: a reset or a reboot ends the faults it fixes and no others, a flaky fault comes
back, the ground truth records every remedy and its true effect, and the webhooks refuse what is not one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.mock_dcgm.faults import FaultError, NotFoundError, RemedyRefusedError
from services.mock_dcgm.fleet import Fleet
from services.mock_dcgm.remedies import Remedy
from services.mock_dcgm.server import MockServer
from tests.helpers.mock_fleet import GPU, H100, make_fleet, reading, served_fleet


def one_fault(request: dict[str, Any]) -> tuple[Fleet, Any, str]:
    fleet, hand = make_fleet(nodes=1, gpus=8)
    fleet.inject({"node": H100, "gpu": GPU, **request})
    hand.t = 120
    return fleet, hand, fleet.nodes[H100].gpus[GPU].uuid


@pytest.mark.parametrize(
    ("request_", "reset_ends", "reboot_ends"),
    [
        ({"kind": "xid", "params": {"code": 119}}, True, True),  # GSP timeout: NVIDIA says reset
        ({"kind": "xid", "params": {"code": 95}}, True, True),
        ({"kind": "dbe"}, True, True),  # the reset applies the pending remap
        ({"kind": "hang"}, True, True),
        ({"kind": "xid", "params": {"code": 79}}, False, True),  # NVIDIA: restart the machine
        ({"kind": "row_remap_failure"}, False, False),  # until a repair
        ({"kind": "thermal_runaway"}, False, False),
        ({"kind": "xid", "params": {"code": 119}, "fixed_by": "repair"}, False, False),
        ({"kind": "xid", "params": {"code": 13}, "fixed_by": "reboot_node"}, False, True),
    ],
)
def test_each_fault_ends_on_the_remedy_that_fixes_it_and_no_lesser_one(
    request_: dict[str, Any], reset_ends: bool, reboot_ends: bool
) -> None:
    remedies: tuple[tuple[Remedy, bool], ...] = (("reset_gpu", reset_ends), ("reboot_node", reboot_ends))
    for remedy, ends in remedies:
        fleet, _, uuid = one_fault(request_)
        done = fleet.remedy(remedy, {"gpu_uuid": uuid, "node": "gpu-node-00", "plan_id": "7"})
        (fault,) = fleet.ground_truth()["faults"]
        assert fault["active"] is (not ends), remedy
        assert fault["ended_by"] == (remedy if ends else None)
        assert done["faults_ended" if ends else "faults_left"] == [fault["id"]]
        assert (done["ok"], done["plan_id"], done["hostname"]) == (True, 7, "gpu-node-00")
        assert fleet.ground_truth()["remedies"] == [done]


def test_a_reset_clears_the_gpus_state_and_leaves_its_neighbours_alone() -> None:
    fleet, hand, uuid = one_fault({"kind": "dbe"})
    neighbour = fleet.inject({"kind": "xid", "node": H100, "gpu": GPU - 1, "params": {"code": 119}})
    assert reading(fleet, H100, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert fleet.compute_check([uuid], "hard_failure")["passed"] is False
    fleet.remedy("reset_gpu", {"gpu_uuid": uuid})
    hand.t = 300
    assert reading(fleet, H100, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 0
    assert reading(fleet, H100, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    assert reading(fleet, H100, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL") == 1  # the history stays
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 0
    assert fleet.compute_check([uuid], "hard_failure")["passed"] is True
    assert fleet.describe(neighbour)["active"] is True  # a reset is the GPU's own
    fleet.remedy("reboot_node", {"node": "gpu-node-00"})  # a reboot resets every GPU of the node
    assert fleet.describe(neighbour)["ended_by"] == "reboot_node"


def test_a_gpu_off_the_bus_cannot_be_reset_but_a_reboot_brings_it_back_once() -> None:
    fleet, hand, uuid = one_fault({"kind": "fall_off_bus"})
    with pytest.raises(RemedyRefusedError, match="off the bus"):
        fleet.remedy("reset_gpu", {"gpu_uuid": uuid})
    refused = fleet.ground_truth()["remedies"][0]
    assert (refused["ok"], refused["faults_ended"], len(refused["faults_left"])) == (False, [], 1)
    fleet.remedy("reboot_node", {"gpu_uuid": uuid})
    hand.t = 300
    assert reading(fleet, H100, "DCGM_FI_DEV_GPU_TEMP") > 0  # on the bus again: its series are back


def test_a_gpu_that_falls_off_again_and_again_stays_broken_until_its_repair() -> None:
    fleet, hand, uuid = one_fault({"kind": "fall_off_bus", "recur_after_s": 600, "recur_probability": 1})
    for k in range(3):
        done = fleet.remedy("reboot_node", {"node": "gpu-node-00"})
        (recurrence,) = done["recurrences"]
        assert recurrence["start_ms"] == done["time_ms"] + 600_000
        hand.t += 900
        assert fleet.compute_check([uuid], "hard_failure")["passed"] is False, k
    fleet.repair({"gpu_uuid": uuid})
    hand.t += 3600
    assert fleet.compute_check([uuid], "hard_failure")["passed"] is True
    assert not [f for f in fleet.ground_truth()["faults"] if f["active"]]


def test_a_flaky_fault_recurs_with_its_probability_and_the_same_seed_draws_the_same() -> None:
    def recurred(seed: int) -> list[bool]:
        out = []
        for gpu in range(8):
            fleet, hand = make_fleet(nodes=1, gpus=8, seed=seed)
            fleet.inject({"kind": "xid", "node": 0, "gpu": gpu, "params": {"code": 119},
                          "recur_after_s": 3600, "recur_probability": 0.5})  # fmt: skip
            hand.t = 60
            done = fleet.remedy("reset_gpu", {"gpu_uuid": fleet.nodes[0].gpus[gpu].uuid})
            out.append(bool(done["recurrences"]))
        return out

    draws = recurred(1) + recurred(2) + recurred(3)
    assert 0 < sum(draws) < len(draws)
    assert recurred(2) == draws[8:16]
    fleet, hand, uuid = one_fault({"kind": "xid", "params": {"code": 119}, "recur_after_s": 3600,
                                   "recur_probability": 1})  # fmt: skip
    fleet.remedy("reset_gpu", {"gpu_uuid": uuid})
    first, again = fleet.ground_truth()["faults"]
    assert again["recurrence_of"] == first["id"]
    assert again["start_ms"] == first["end_ms"] + 3_600_000
    assert (again["recur_after_s"], again["recur_probability"]) == (3600, 1)  # flaky still
    hand.t = 120 + 3601
    assert fleet.compute_check([uuid], "hard_failure")["passed"] is False


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        ({"kind": "dbe", "fixed_by": "prayer"}, "fixed_by must be"),
        ({"kind": "dbe", "recur_probability": 0.5}, "recur_after_s"),
        ({"kind": "dbe", "recur_after_s": 60}, "recur_probability"),
        ({"kind": "dbe", "recur_after_s": 60, "recur_probability": 1.5}, "recur_probability"),
        ({"kind": "dbe", "recur_after_s": -1, "recur_probability": 1}, "recur_after_s"),
        ({"kind": "dbe", "recur_after_s": True, "recur_probability": 1}, "recur_after_s"),
    ],
)
def test_a_bad_remedy_model_in_a_fault_is_refused(request_: dict[str, Any], error: str) -> None:
    fleet, _ = make_fleet(nodes=1, gpus=8)
    with pytest.raises(FaultError, match=error):
        fleet.inject({"node": 0, "gpu": 0, **request_})


@pytest.mark.parametrize(
    ("remedy", "request_", "error"),
    [
        ("reset_gpu", {"node": "gpu-node-00"}, FaultError),  # a reset names its GPUs
        ("reset_gpu", {"gpu_uuid": "GPU-00000000-0000-4000-8000-000000000000"}, NotFoundError),
        ("reboot_node", {"node": "gpu-node-99"}, NotFoundError),
        ("reset_gpu", {"gpu_uuid": "{gpu}", "node": "gpu-node-01"}, NotFoundError),  # not the GPU's host
        ("reset_gpu", {"gpu_uuid": "{gpu}", "operation": "reboot"}, FaultError),
        ("reset_gpu", {"gpu_uuid": "{gpu}", "plan_id": "1; drop"}, FaultError),
        ("reboot_node", {"node": "gpu-node-00", "force": True}, FaultError),
    ],
)
def test_a_remedy_that_names_nothing_here_is_refused_and_changes_nothing(
    remedy: Any, request_: dict[str, Any], error: type[Exception]
) -> None:
    fleet, hand = make_fleet(nodes=2, gpus=2)
    fleet.inject({"kind": "dbe", "node": 0, "gpu": 0})
    hand.t = 60
    uuid = fleet.nodes[0].gpus[0].uuid
    with pytest.raises(error):
        fleet.remedy(remedy, {k: v.replace("{gpu}", uuid) if isinstance(v, str) else v
                              for k, v in request_.items()})  # fmt: skip
    truth = fleet.ground_truth()
    assert truth["remedies"] == []
    assert truth["faults"][0]["active"] is True


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Fleet, MockServer]]:
    with served_fleet(nodes=2, gpus=2, seed=5) as (fleet, server):
        yield fleet, server


def test_the_webhooks_take_what_the_exec_driver_sends(served: tuple[Fleet, MockServer]) -> None:
    fleet, server = served
    uuid = fleet.nodes[1].gpus[1].uuid
    fleet.inject({"kind": "xid", "gpu_uuid": uuid, "params": {"code": 119}})
    sent = {
        "operation": "reset_gpu",
        "node": "gpu-node-01",
        "plan_id": "3",
        "gpu_uuid": uuid,
        "gpu_index": "1",
    }
    reset = httpx.post(f"{server.admin_url}/reset-gpu", json=sent, timeout=10)
    assert reset.status_code == 200
    assert len(reset.json()["faults_ended"]) == 1
    check = httpx.post(
        f"{server.admin_url}/compute-check", json={**sent, "operation": "compute_check"}, timeout=10
    )
    assert check.status_code == 200
    both = ",".join(g.uuid for g in fleet.nodes[1].gpus)
    reboot = httpx.post(f"{server.admin_url}/reboot", timeout=10,
                        json={"operation": "reboot", "node": "gpu-node-01", "plan_id": "3", "gpu_uuid": both,
                              "gpu_index": "0,1"})  # fmt: skip
    assert reboot.status_code == 200
    assert reboot.json()["gpu_uuids"] == both.split(",")
    truth = httpx.get(f"{server.admin_url}/ground-truth", timeout=10).json()["remedies"]
    assert [r["remedy"] for r in truth][-2:] == ["reset_gpu", "reboot_node"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
_FIELD = st.sampled_from(["operation", "node", "gpu_uuid", "gpu_index", "plan_id"])


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    path=st.sampled_from(["/reset-gpu", "/reboot"]),
    body=st.one_of(
        st.binary(max_size=80),
        _JSON.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(_FIELD, _JSON, max_size=5).map(lambda v: json.dumps(v).encode()),
    ),
)
def test_what_is_not_a_remedy_gets_a_clear_4xx_and_ends_no_fault(
    served: tuple[Fleet, MockServer], path: str, body: bytes
) -> None:
    fleet, server = served
    fault = fleet.inject({"kind": "row_remap_failure", "node": 0, "gpu": 0})  # nothing but a repair ends it
    before = len(fleet.ground_truth()["remedies"])
    reply = httpx.post(f"{server.admin_url}{path}", content=body, timeout=10)
    if reply.status_code == 200:  # a well-formed request that happens to name this fleet's node 0 or 1
        assert reply.json()["ok"] is True
        assert len(fleet.ground_truth()["remedies"]) == before + 1
    else:
        assert 400 <= reply.status_code < 500, reply.text
        assert reply.json()["error"]
        assert len(fleet.ground_truth()["remedies"]) == before
    assert fleet.describe(fault)["active"] is True
    fleet.clear(fault.id)

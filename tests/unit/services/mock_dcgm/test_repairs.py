"""A repaired GPU: a repair ends the GPU's faults and resets it, and the ground truth says so."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from tests.helpers.mock_fleet import H100, make_fleet, reading


def test_a_repaired_gpu_is_reset_and_its_faults_end() -> None:
    fleet, hand = make_fleet(nodes=1, gpus=8)
    assert H100 == 0
    fleet.inject({"kind": "dbe", "node": 0, "gpu": 5, "after_s": 10})
    fleet.inject(
        {
            "kind": "xid",
            "node": 0,
            "gpu": 5,
            "after_s": 20,
            "params": {"code": 95, "lines": 1000, "over_s": 100},
        }
    )
    fleet.inject({"kind": "sbe_storm", "node": 0, "gpu": 5, "after_s": 0})
    hand.t = 60
    assert reading(fleet, 0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 1
    assert reading(fleet, 0, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert reading(fleet, 0, "DCGM_FI_DEV_XID_ERRORS") == 95
    logged = len(fleet.journal(0, after_cursor=None, since=None)[0].splitlines())
    repaired = fleet.repair({"node": 0, "gpu": 5})
    assert len(repaired["faults_ended"]) == 3
    hand.t = 600
    assert reading(fleet, 0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0  # a reset clears the volatile counts
    assert reading(fleet, 0, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL") == 1  # the GPU's history stays
    assert reading(fleet, 0, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == 0
    assert reading(fleet, 0, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 0
    assert reading(fleet, 0, "DCGM_FI_DEV_XID_ERRORS") == 0
    # the flood stopped at the repair: every line was written by then
    assert len(fleet.journal(0, after_cursor=None, since=None)[0].splitlines()) == logged
    (truth,) = fleet.ground_truth()["repairs"]
    assert (truth["gpu_uuid"], truth["node"], truth["gpu"]) == (fleet.nodes[0].gpus[5].uuid, 0, 5)
    assert all(f["end_ms"] == truth["time_ms"] for f in fleet.ground_truth()["faults"])


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        ([], "names one GPU"),
        ({"node": 0, "gpu": 1, "kind": "xid"}, "names one GPU"),
        ({"node": 0, "gpu": 99}, "gpu must be"),
        ({"gpu_uuid": "GPU-nope"}, "no GPU with UUID"),
        ({"node": True, "gpu": 0}, "integer node and gpu"),
    ],
)
def test_a_repair_that_names_no_gpu_is_refused(request_: Any, error: str) -> None:
    fleet, _ = make_fleet(nodes=1, gpus=2)
    with pytest.raises(FaultError, match=error):
        fleet.repair(request_)


def test_the_admin_api_repairs_and_says_why_it_will_not() -> None:
    fleet = Fleet(FleetSpec(nodes=1, gpus_per_node=2, seed=3), SimClock(start_s=time.time()))
    with MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False) as server:
        server.start()
        uuid = fleet.nodes[0].gpus[1].uuid
        done = httpx.post(f"{server.admin_url}/repairs", content=json.dumps({"gpu_uuid": uuid}), timeout=5)
        assert done.status_code == 201
        assert done.json()["gpu_uuid"] == uuid
        bad = httpx.post(f"{server.admin_url}/repairs", content=b'{"gpu": 1}', timeout=5)
        assert bad.status_code == 400
        assert "node and gpu" in bad.json()["error"]
        assert (
            httpx.get(f"{server.admin_url}/ground-truth", timeout=5).json()["repairs"][0]["gpu_uuid"] == uuid
        )

"""The mock's job crash: one job on several GPUs, the same application XID on each within seconds."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.fleet import Fleet
from tests.helpers.mock_fleet import make_fleet


def labels(fleet: Fleet, node: int, gpu: int) -> dict[str, str]:
    text = fleet.scrape(node, timestamps=False)[0]
    uuid = fleet.nodes[node].gpus[gpu].uuid
    line = re.search(rf'^DCGM_FI_DEV_XID_ERRORS\{{([^}}]*UUID="{uuid}"[^}}]*)\}} (\S+)$', text, re.M)
    assert line, f"no XID line for {uuid}"
    return {**dict(re.findall(r'(\w+)="([^"]*)"', line[1])), "xid": line[2]}


def test_a_job_crash_spans_its_gpus_across_nodes_with_one_job_and_one_xid() -> None:
    fleet, hand = make_fleet()
    first = fleet.inject({"kind": "job_crash", "node": 0, "gpu": 6, "after_s": 7200, "duration_s": 600,
                          "params": {"gpus": 4, "code": 31, "spread_s": 3}})  # fmt: skip
    members = [(0, 6), (0, 7), (1, 0), (1, 1)]
    hand.t = 7200 - 60  # the job runs before it crashes: its workers in the GPUs' labels, no XID yet
    before = [labels(fleet, n, g) for n, g in members]
    assert [x["pod"] for x in before] == [f"ddp-crash-{first.job_crash:04d}-worker-{k}" for k in range(4)]
    assert {x["namespace"] for x in before} == {"ml-training"}
    assert {x["xid"] for x in before} == {"0"}
    hand.t = 7200 + 3
    assert {labels(fleet, n, g)["xid"] for n, g in members} == {"31"}
    assert labels(fleet, 1, 2)["pod"] != before[0]["pod"]  # the next GPU is not in the job
    truth = fleet.ground_truth()
    (crash,) = truth["job_crashes"]
    assert crash["job"] == f"ml-training/ddp-crash-{first.job_crash:04d}"
    assert crash["gpus"] == [fleet.nodes[n].gpus[g].uuid for n, g in members]
    assert crash["hosts"] == ["gpu-node-00", "gpu-node-01"]
    assert crash["last_ms"] - crash["start_ms"] == 3000
    xids = [f for f in truth["faults"] if f["job_crash"] == crash["id"]]
    assert len(xids) == 4
    assert all(not f["hard_failure"] and f["params"]["code"] == 31 for f in xids)
    hand.t = 7200 + 3 + 600  # the XIDs cleared, the job gone: the GPUs run their own jobs again
    assert {labels(fleet, n, g)["xid"] for n, g in members} == {"0"}
    assert all(not x["pod"].startswith("ddp-crash") for x in (labels(fleet, n, g) for n, g in members))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"gpus": 1}, "gpus must be a number in 2..4096"),
        ({"gpus": 2.5}, "whole numbers"),
        ({"job": -1}, "job must be a number"),
        ({"gpus": 40}, "more GPUs than the fleet has"),
        ({"code": 0}, "code must be a number"),
        ({"spread_s": True}, "spread_s must be a number"),
        ({"ran_s": "1h"}, "ran_s must be a number"),
        ({"level": 1}, "takes no parameter 'level'"),
    ],
)
def test_hostile_job_crash_requests_are_refused_clearly(params: dict[str, Any], message: str) -> None:
    fleet, _ = make_fleet()
    with pytest.raises(FaultError, match=message):
        fleet.inject({"kind": "job_crash", "node": 0, "gpu": 0, "params": params})
    with pytest.raises(FaultError, match="duration_s"):
        fleet.inject({"kind": "job_crash", "node": 0, "gpu": 0, "duration_s": -1})
    assert fleet.ground_truth()["job_crashes"] == []


@settings(max_examples=60, deadline=None)
@given(node=st.integers(0, 3), gpu=st.integers(0, 7), n=st.integers(2, 32), spread=st.floats(0, 120))
def test_any_job_crash_that_fits_puts_one_xid_on_each_gpu_within_its_spread(
    node: int, gpu: int, n: int, spread: float
) -> None:
    fleet, _ = make_fleet()
    request = {
        "kind": "job_crash",
        "node": node,
        "gpu": gpu,
        "after_s": 100,
        "params": {"gpus": n, "spread_s": spread},
    }
    if node * 8 + gpu + n > 32:
        with pytest.raises(FaultError):
            fleet.inject(request)
        return
    fleet.inject(request)
    (crash,) = fleet.ground_truth()["job_crashes"]
    assert len(set(crash["gpus"])) == n
    assert 0 <= crash["last_ms"] - crash["start_ms"] <= spread * 1000 + 1

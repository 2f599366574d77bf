"""Each injected fault shows in the exposition as the real hardware would show it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.fleet import Fleet
from tests.helpers.mock_fleet import A100, GPU, H100, T0, V100, make_fleet, reading


def run_fault(
    kind: str, node: int, *, hours: float, params: dict[str, Any] | None = None
) -> tuple[Fleet, Any]:
    fleet, hand = make_fleet()
    fleet.inject({"kind": kind, "node": node, "gpu": GPU, "after_s": 60, "params": params or {}})
    hand.t = hours * 3600
    return fleet, hand


def test_sbe_storm_grows_faster_over_hours() -> None:
    fleet, hand = run_fault("sbe_storm", H100, hours=1)
    first_hour = reading(fleet, H100, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    hand.t = 3 * 3600 + 60
    three_hours = reading(fleet, H100, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    assert three_hours - first_hour > 2 * 2 * first_hour  # hours 2-3 add far more than hour 1
    assert reading(fleet, H100, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") >= 1


def test_volatile_dbe_counts_logs_xid_48_and_remaps_a_row() -> None:
    fleet, _ = run_fault("dbe", A100, hours=0.1)
    assert reading(fleet, A100, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 1
    assert reading(fleet, A100, "DCGM_FI_DEV_XID_ERRORS") == 48
    assert reading(fleet, A100, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 1
    assert reading(fleet, A100, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    assert reading(fleet, A100, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu=0) == 0


def test_retired_pages_accumulate_past_dcgms_limit_on_volta() -> None:
    fleet, _ = run_fault("retired_pages", V100, hours=3)
    assert reading(fleet, V100, "DCGM_FI_DEV_RETIRED_SBE") >= 63


def test_pending_retirement() -> None:
    fleet, _ = run_fault("pending_retirement", V100, hours=0.1)
    assert reading(fleet, V100, "DCGM_FI_DEV_RETIRED_PENDING") == 1
    assert reading(fleet, V100, "DCGM_FI_DEV_XID_ERRORS") == 63


def test_row_remap_failure() -> None:
    fleet, _ = run_fault("row_remap_failure", H100, hours=0.1)
    assert reading(fleet, H100, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == 1
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 64


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119])
def test_xid_sets_the_last_xid(code: int) -> None:
    fleet, _ = run_fault("xid", H100, hours=0.1, params={"code": code})
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == code
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS", gpu=0) == 0


def test_thermal_runaway_crosses_slowdown_and_throttles() -> None:
    fleet, hand = make_fleet()
    fleet.inject(
        {
            "kind": "thermal_runaway",
            "node": H100,
            "gpu": GPU,
            "after_s": 60,
            "params": {"c_per_minute": 5, "max_c": 70},
        }
    )
    for step in range(1, 80):
        hand.t = step * 30
        fleet.scrape(H100, timestamps=False)
    temp = reading(fleet, H100, "DCGM_FI_DEV_GPU_TEMP")
    reasons = int(reading(fleet, H100, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
    assert temp >= 87  # the H100's slowdown temperature
    assert reasons & Reason.HW_THERMAL_SLOWDOWN
    assert reading(fleet, H100, "DCGM_FI_DEV_THERMAL_VIOLATION") > 0


def test_power_brake_sets_its_reason_and_cuts_clocks() -> None:
    fleet, _ = run_fault("power_brake", H100, hours=0.5)
    reasons = int(reading(fleet, H100, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
    assert reasons & Reason.HW_POWER_BRAKE_SLOWDOWN
    assert reading(fleet, H100, "DCGM_FI_DEV_POWER_VIOLATION") > 0


def test_pcie_replay_storm() -> None:
    fleet, _ = run_fault("pcie_replay_storm", H100, hours=1)
    assert reading(fleet, H100, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER") >= 5000


def test_nvlink_errors() -> None:
    fleet, _ = run_fault("nvlink_errors", H100, hours=1)
    for name in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"):
        assert reading(fleet, H100, f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL") > 0


def test_fall_off_bus_removes_the_series_slows_the_scrape_and_comes_back() -> None:
    fleet, hand = make_fleet()
    fault = fleet.inject({"kind": "fall_off_bus", "node": H100, "gpu": GPU})
    hand.t = 60
    text, delay = fleet.scrape(H100, timestamps=False)
    assert fleet.nodes[H100].gpus[GPU].uuid not in text
    assert fleet.nodes[H100].gpus[0].uuid in text
    assert delay == 1.5
    fleet.clear(fault.id)
    hand.t = 120
    text, delay = fleet.scrape(H100, timestamps=False)
    assert fleet.nodes[H100].gpus[GPU].uuid in text
    assert delay == 0
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 79


def test_hang_keeps_the_job_but_drops_utilisation() -> None:
    fleet, hand = make_fleet()
    gpu = fleet.nodes[H100].gpus[GPU]
    while gpu.job is None or gpu.phase != "peak":
        hand.t += 60
        fleet.scrape(H100, timestamps=False)
    fleet.inject({"kind": "hang", "node": H100, "gpu": GPU})
    hand.t += 30
    text = fleet.scrape(H100, timestamps=False)[0]
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL") and gpu.uuid in x)
    assert line.endswith(" 0")
    assert f'pod="{gpu.job.pod}"' in line


def test_ground_truth_lists_faults_with_start_and_subsystem() -> None:
    fleet, hand = make_fleet()
    fleet.inject({"kind": "dbe", "gpu_uuid": fleet.nodes[1].gpus[3].uuid, "after_s": 120})
    hand.t = 60
    (fault,) = fleet.ground_truth()["faults"]
    assert fault["subsystem"] == "memory"
    assert fault["start_ms"] == int((T0 + 120) * 1000)
    assert (fault["node"], fault["gpu"], fault["active"]) == (1, 3, False)
    assert fault["gpu_uuid"] == fleet.nodes[1].gpus[3].uuid


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"kind": "meltdown", "node": 0, "gpu": 0}, "unknown fault kind"),
        ({"kind": "xid", "node": 9, "gpu": 0}, "node must be"),
        ({"kind": "xid", "node": 0, "gpu": -1}, "gpu must be"),
        ({"kind": "xid", "node": "0", "gpu": 0}, "integer node and gpu"),
        ({"kind": "xid", "node": True, "gpu": 0}, "integer node and gpu"),
        ({"kind": "xid", "gpu_uuid": "GPU-nope"}, "no GPU with UUID"),
        ({"kind": "xid", "node": 0, "gpu": 0, "params": {"code": 0}}, "between 1 and 999"),
        ({"kind": "xid", "node": 0, "gpu": 0, "params": {"colour": 1}}, "takes no parameter"),
        ({"kind": "xid", "node": 0, "gpu": 0, "params": {"code": "79"}}, "must be a number"),
        ({"kind": "xid", "node": 0, "gpu": 0, "params": {"code": float("nan")}}, "between 0"),
        ({"kind": "xid", "node": 0, "gpu": 0, "after_s": -5}, "after_s"),
        ({"kind": "xid", "node": 0, "gpu": 0, "duration_s": 0}, "duration_s"),
        ({"kind": "xid", "node": 0, "gpu": 0, "rm": "-rf"}, "unknown fault fields"),
        ({"kind": "retired_pages", "node": H100, "gpu": 0}, "does not retire pages"),
        ({"kind": "row_remap_failure", "node": V100, "gpu": 0}, "no row remapping"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_hostile_fault_requests_are_refused_clearly(request_: Any, message: str) -> None:
    fleet, _ = make_fleet()
    with pytest.raises(FaultError, match=message):
        fleet.inject(request_)
    assert fleet.ground_truth()["faults"] == []


def test_clearing_an_xid_fault_resets_the_last_xid_but_not_a_fall_off_the_bus() -> None:
    fleet, hand = make_fleet()
    xid = fleet.inject({"kind": "xid", "node": H100, "gpu": GPU, "params": {"code": 74}})
    hand.t = 60
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 74
    fleet.clear(xid.id)  # the GPU was reset
    hand.t = 120
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 0
    fleet.inject({"kind": "xid", "node": H100, "gpu": GPU, "params": {"code": 74}})
    hand.t = 180
    assert reading(fleet, H100, "DCGM_FI_DEV_XID_ERRORS") == 74

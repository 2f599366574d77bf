"""How GPUs fail over time in the mock (issue 16): precursors, hot-but-healthy load, failure truth."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.simulation import COUNTER_FIELDS
from tests.helpers.mock_fleet import A100, GPU, H100, T0, V100, make_fleet, reading

HOUR = 3600


def test_remapped_rows_accumulate_on_ampere_and_are_refused_on_volta() -> None:
    fleet, hand = make_fleet()
    fleet.inject({"kind": "remapped_rows", "node": A100, "gpu": GPU, "after_s": 60,
                  "params": {"rows_per_hour": 1, "growth_per_hour": 0.5}})  # fmt: skip
    hand.t = 10 * HOUR
    ten = reading(fleet, A100, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")
    hand.t = 20 * HOUR
    twenty = reading(fleet, A100, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")
    assert twenty - ten > ten  # growing: the second ten hours add more than the first
    assert reading(fleet, A100, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 0
    with pytest.raises(FaultError, match="no row remapping"):
        fleet.inject({"kind": "remapped_rows", "node": V100, "gpu": 0})


def test_pcie_replays_and_retired_pages_can_grow() -> None:
    fleet, hand = make_fleet()
    fleet.inject({"kind": "pcie_replay_storm", "node": H100, "gpu": GPU, "after_s": 0,
                  "params": {"replays_per_minute": 1, "growth_per_hour": 1}})  # fmt: skip
    fleet.inject({"kind": "retired_pages", "node": V100, "gpu": GPU, "after_s": 0,
                  "params": {"pages_per_hour": 0.5, "growth_per_hour": 0.2}})  # fmt: skip
    hand.t = 4 * HOUR
    replays = reading(fleet, H100, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    assert replays >= 60 * (4 + 8)  # 60/h * (h + g h^2 / 2)
    assert reading(fleet, V100, "DCGM_FI_DEV_RETIRED_SBE") >= 0.5 * (4 + 0.2 * 8) - 1


def _temps_at_full_load(kind: str | None, params: dict[str, float], hours: float) -> list[tuple[float, int]]:
    fleet, hand = make_fleet()
    if kind:
        fleet.inject({"kind": kind, "node": H100, "gpu": GPU, "after_s": 0, "params": params})
    fleet.inject({"kind": "heavy_workload", "node": H100, "gpu": GPU, "after_s": 0, "params": {"extra_c": 0}})
    out = []
    gpu = fleet.nodes[H100].gpus[GPU]
    for k in range(1, int(hours * 12) + 1):
        hand.t = k * 300
        fleet.scrape(H100, timestamps=False)
        out.append((gpu.temp_c, gpu.reasons))
    return out


def test_temperature_creeps_up_at_constant_load() -> None:
    steady = _temps_at_full_load(None, {}, 12)
    creep = _temps_at_full_load("thermal_creep", {"c_per_hour": 0.5, "max_c": 30}, 12)
    assert abs(steady[-1][0] - steady[12][0]) < 3  # the same load: the same temperature
    assert creep[-1][0] - creep[12][0] > 4  # +0.5 C/h over 11 h at the same load


def test_a_heavy_workload_runs_hot_but_never_reaches_slowdown() -> None:
    fleet, hand = make_fleet()
    fleet.inject({"kind": "heavy_workload", "node": H100, "gpu": GPU, "after_s": 0})
    gpu = fleet.nodes[H100].gpus[GPU]
    temps, hw = [], 0
    for k in range(1, 48 * 6):
        hand.t = k * 600
        fleet.scrape(H100, timestamps=False)
        temps.append(gpu.temp_c)
        hw |= gpu.reasons & (Reason.HW_THERMAL_SLOWDOWN | Reason.HW_SLOWDOWN)
        assert gpu.load > 0.9  # around the clock
    slowdown = gpu.model.slowdown_temp_c
    assert slowdown - 7 < min(temps[6:])
    assert max(temps) < slowdown
    assert hw == 0


def test_the_ground_truth_carries_the_failure_time_after_its_precursor() -> None:
    fleet, hand = make_fleet()
    uuid = fleet.nodes[H100].gpus[GPU].uuid
    fleet.inject({"kind": "sbe_storm", "gpu_uuid": uuid, "after_s": 3 * HOUR + 7.5})
    fleet.inject({"kind": "dbe", "gpu_uuid": uuid, "after_s": 55 * HOUR + 31.25})
    fleet.inject({"kind": "xid", "gpu_uuid": uuid, "after_s": 60 * HOUR, "params": {"code": 79}})
    fleet.inject({"kind": "xid", "node": A100, "gpu": 0, "after_s": 600, "params": {"code": 13}})
    fleet.inject({"kind": "fall_off_bus", "node": V100, "gpu": 1, "after_s": 900, "duration_s": 600})
    hand.t = 61 * HOUR
    truth = fleet.ground_truth()
    failures = truth["failures"]
    assert set(failures) == {uuid, fleet.nodes[V100].gpus[1].uuid}  # an XID 13 is not a failure
    assert failures[uuid]["failure_ms"] == int((T0 + 55 * HOUR + 31.25) * 1000)
    assert failures[uuid]["failure_kind"] == "dbe"
    assert failures[uuid]["precursor_start_ms"] == int((T0 + 3 * HOUR + 7.5) * 1000)
    assert failures[fleet.nodes[V100].gpus[1].uuid]["precursor_start_ms"] is None
    kinds = {(f["kind"], f["hard_failure"], f["precursor"]) for f in truth["faults"]}
    assert ("sbe_storm", False, True) in kinds
    assert ("xid", False, False) in kinds
    ended = next(f for f in truth["faults"] if f["kind"] == "fall_off_bus")
    assert ended["end_ms"] == int((T0 + 1500) * 1000)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.floats(min_value=1, max_value=7200), min_size=1, max_size=20))
def test_counters_depend_on_simulated_time_only_not_on_how_often_it_is_scraped(steps: list[float]) -> None:
    # Background counts and precursors are functions of time: a GPU scraped at any cadence
    # shows the same counters at the same moment.
    def counters_at(ticks: list[float]) -> dict[str, float | None]:
        fleet, hand = make_fleet(nodes=1, gpus=2, seed=11)
        fleet.inject({"kind": "sbe_storm", "node": 0, "gpu": 1, "after_s": 100})
        fleet.inject({"kind": "pcie_replay_storm", "node": 0, "gpu": 1, "after_s": 50,
                      "params": {"replays_per_minute": 0.2, "growth_per_hour": 0.5}})  # fmt: skip
        for t in ticks:
            hand.t = t
            fleet.scrape(0, timestamps=False)
        values = {}
        for g in fleet.nodes[0].gpus:
            for name, v in g.values().items():
                if name in COUNTER_FIELDS:
                    values[f"{g.index}:{name}"] = v
        return values

    ticks, t = [], 0.0
    for s in steps:
        t += s
        ticks.append(t)
    assert counters_at(ticks) == counters_at([t])

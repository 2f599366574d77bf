"""Judgement as a table of small rules: each rule alone on hand-built features, and the table's
promise that a subsystem's verdict is exactly what its own rule finds (the patterns' subsystem, what
they find under the place's ceiling)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings

from services.scorer.features import GpuFeatures, XidCounts
from services.scorer.patterns import Burst
from services.scorer.rules import (
    RULE_TABLE,
    SUBSYSTEMS,
    Case,
    Rule,
    Verdict,
    cap_at_the_place,
    evaluate,
    judge_availability,
    judge_memory,
    judge_nvlink,
    judge_patterns,
    judge_pcie,
    judge_power,
    judge_thermal,
    judge_xids,
)
from shared.store.correlated_inputs import Episode
from tests.helpers.scorer import HEALTHY, NOW, RULES
from tests.helpers.scorer_inputs import HEARD_UNTIL, gpu_features

# The rule that alone decides each subsystem's verdict. A rule added to RULE_TABLE is named here, or
# among the rules that act across subsystems, or test_every_rule_in_the_table_is_accounted_for fails.
OWN: dict[Rule, str] = {
    judge_availability: "availability",
    judge_memory: "memory",
    judge_thermal: "thermal",
    judge_power: "power",
    judge_pcie: "pcie",
    judge_nvlink: "nvlink",
    judge_xids: "xid",
}
ACROSS: tuple[Rule, ...] = (judge_patterns, cap_at_the_place)  # the subsystem each pattern names; a ceiling
PLACE = Episode(
    "node",
    "n1",
    NOW - timedelta(seconds=300),
    NOW - timedelta(seconds=60),
    ["GPU-1", "GPU-2"],
    ["n1"],
    [79],
    3,
)


def run(rule: Rule, gpu: GpuFeatures, heard: datetime = NOW) -> dict[str, Verdict]:
    """The verdicts `rule` alone writes, from healthy ones."""
    verdicts: dict[str, Verdict] = {subsystem: Verdict(subsystem) for subsystem in SUBSYSTEMS}
    rule(Case(gpu, RULES, NOW, heard), verdicts)
    return verdicts


def found(rule: Rule, heard: datetime = NOW, **changes: Any) -> dict[str, tuple[str, str | None, str]]:
    verdicts = run(rule, replace(HEALTHY, **changes), heard)
    return {k: (v.state, v.rule, v.action) for k, v in verdicts.items() if v.state != "healthy"}


def test_every_rule_in_the_table_is_accounted_for() -> None:
    assert set(RULE_TABLE) == set(OWN) | set(ACROSS)
    assert len(RULE_TABLE) == len(set(RULE_TABLE)), "a rule listed twice judges twice"
    assert RULE_TABLE[-1] is cap_at_the_place, "the place's ceiling caps what every other rule found"
    assert set(OWN.values()) | {"history"} == set(SUBSYSTEMS)


@settings(max_examples=300, deadline=None)
@given(gpu=gpu_features(), heard_until=HEARD_UNTIL)
def test_each_subsystems_verdict_is_exactly_what_its_own_rule_finds(
    gpu: GpuFeatures, heard_until: datetime | None
) -> None:
    heard = NOW if heard_until is None else min(NOW, heard_until)
    verdicts = evaluate(gpu, RULES, NOW, heard_until)
    for rule, subsystem in OWN.items():
        alone = run(rule, gpu, heard)
        assert verdicts[subsystem] == alone[subsystem], rule.__name__
        assert all(v == Verdict(s) for s, v in alone.items() if s != subsystem), (
            f"{rule.__name__} wrote others"
        )
    history = run(judge_patterns, gpu)
    cap_at_the_place(Case(gpu, RULES, NOW, heard), history)
    assert verdicts["history"] == history["history"]


SILENT = {"availability": ("unhealthy", "not_reporting", "reboot_node")}
TWICE_SILENT = {"availability": ("unhealthy", "not_reporting", "inspect")}  # a second fall off the bus


@pytest.mark.parametrize(
    ("changes", "heard_ago", "expected"),
    [
        ({"last_time": NOW - timedelta(seconds=60)}, 0, {}),
        ({"last_time": NOW - timedelta(seconds=61)}, 0, SILENT),
        ({"last_time": NOW - timedelta(seconds=61)}, 30, {}),  # the fleet fell silent with it
        ({"last_time": None}, 0, SILENT),
        ({"last_time": None, "lost_times": (NOW.isoformat(),), "xids": {79: (1, 1)}}, 0, SILENT),  # one fall
        ({"last_time": None, "xids": {79: (1, 2)}}, 0, TWICE_SILENT),
    ],
)
def test_availability(changes: dict[str, Any], heard_ago: float, expected: dict[str, Any]) -> None:
    assert found(judge_availability, NOW - timedelta(seconds=heard_ago), **changes) == expected


def test_availability_says_how_long_the_gpu_was_silent_against_what() -> None:
    verdict = run(judge_availability, replace(HEALTHY, last_time=NOW - timedelta(seconds=90)))["availability"]
    assert verdict.evidence == {
        "last_seen": "2026-11-21T11:58:30Z",
        "silent_s": 90.0,
        "threshold_s": 60,
        "fall_off_episodes": 0,
        "repeats_counted": {"xid_79": [], "gpu_lost": []},
    }


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, None),
        ({"dbe_volatile": 1, "dbe_new": 1}, ("unhealthy", "volatile_dbe", "reset_gpu")),
        ({"remap_failure": 1}, ("unhealthy", "row_remap_failure", "send_for_repair")),
        ({"retired_pages": 63}, ("unhealthy", "retired_pages_limit", "send_for_repair")),
        ({"retired_pages": 62}, None),
        ({"retired_pending": 1}, ("degraded", "page_retirement_pending", "reset_gpu")),
        ({"remap_pending": 1}, ("degraded", "row_remap_pending", "reset_gpu")),
        ({"sbe_new": 99}, None),
        ({"sbe_new": 100}, ("degraded", "sbe_rate_high", "restart_workload")),
        ({"sbe_new": 6000}, ("unhealthy", "sbe_storm", "reset_gpu")),
        # the worst finding holds, at equal state the stronger action: a DBE and a failed remap is a repair
        (
            {"dbe_volatile": 1, "remap_failure": 1, "remap_pending": 1},
            ("unhealthy", "row_remap_failure", "send_for_repair"),
        ),
        ({"retired_pending": 1, "sbe_new": 100}, ("degraded", "page_retirement_pending", "reset_gpu")),
    ],
)
def test_memory(changes: dict[str, Any], expected: tuple[str, str, str] | None) -> None:
    assert found(judge_memory, **changes) == ({"memory": expected} if expected else {})


def test_memory_rates_are_per_hour_of_elapsed_time_over_at_least_ten_minutes() -> None:
    sbe = run(judge_memory, replace(HEALTHY, sbe_new=50, span_long_s=60))["memory"]  # 50 in 10 min
    assert sbe.evidence == {"sbe_per_hour": 300.0, "new_sbe": 50, "window_s": 3600, "threshold": 100}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"temp_max": None, "reasons_any": 0x40}, None),  # no temperature in the window: nothing to judge
        ({"temp_max": 81}, None),
        ({"temp_max": 82}, ("degraded", "near_slowdown_temperature", "none")),
        ({"reasons_any": 0x20}, ("degraded", "near_slowdown_temperature", "none")),
        ({"temp_max": 87}, ("unhealthy", "hw_thermal_slowdown", "inspect")),
        ({"reasons_any": 0x40}, ("unhealthy", "hw_thermal_slowdown", "inspect")),
        ({"temp_max": 90, "slowdown_c": 95}, ("degraded", "near_slowdown_temperature", "none")),
    ],
)
def test_thermal(changes: dict[str, Any], expected: tuple[str, str, str] | None) -> None:
    assert found(judge_thermal, **changes) == ({"thermal": expected} if expected else {})


def test_thermal_names_the_drivers_reasons_when_it_slows_down() -> None:
    verdict = run(judge_thermal, replace(HEALTHY, temp_max=88, reasons_any=0x44))["thermal"]
    assert verdict.evidence == {
        "temp_max_c": 88,
        "slowdown_c": 87,
        "window_s": 900,
        "reasons": ["sw_power_cap", "hw_thermal_slowdown"],
    }


@pytest.mark.parametrize(("reasons", "hit"), [(0x4, False), (0x40, False), (0x80, True), (0xFF, True)])
def test_power(reasons: int, hit: bool) -> None:
    verdict = run(judge_power, replace(HEALTHY, reasons_any=reasons))["power"]
    assert (verdict.state, verdict.rule, verdict.action) == (
        ("unhealthy", "hw_power_brake", "check_mechanicals") if hit else ("healthy", None, "none")
    )


@pytest.mark.parametrize(
    ("replays", "expected"),
    [
        (99, None),
        (100, ("degraded", "pcie_replays", "none")),
        (999, ("degraded", "pcie_replays", "none")),
        (1000, ("unhealthy", "pcie_replay_storm", "check_mechanicals")),
    ],
)
def test_pcie(replays: int, expected: tuple[str, str, str] | None) -> None:
    assert found(judge_pcie, pcie_new=replays) == ({"pcie": expected} if expected else {})


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"nvlink_crc_new": 99}, None),
        ({"nvlink_crc_new": 100}, ("degraded", "nvlink_crc_errors", "none")),
        ({"nvlink_replay_recovery_new": 1}, ("unhealthy", "nvlink_replay_recovery", "reset_gpu")),
        (
            {"nvlink_replay_recovery_new": 1, "nvlink_crc_new": 500},
            ("unhealthy", "nvlink_replay_recovery", "reset_gpu"),
        ),
    ],
)
def test_nvlink(changes: dict[str, Any], expected: tuple[str, str, str] | None) -> None:
    assert found(judge_nvlink, **changes) == ({"nvlink": expected} if expected else {})


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"xids": {79: (1, 1)}}, ("unhealthy", "xid_79", "reboot_node")),
        ({"xids": {94: (1, 1), 79: (1, 1)}}, ("unhealthy", "xid_79", "reboot_node")),
        ({"xids": {999: (1, 1)}}, ("degraded", "xid_999", "inspect")),  # not in NVIDIA's catalogue
        ({"xids": {43: (1, 1), 92: (1, 1)}}, None),  # NVIDIA: nothing to do
        ({"xids": {48: (0, 3)}}, None),  # aged out
        ({"recovery_action": 2}, ("unhealthy", "driver_recovery_node_reboot", "reboot_node")),
    ],
)
def test_xids(changes: dict[str, Any], expected: tuple[str, str, str] | None) -> None:
    assert found(judge_xids, **changes) == ({"xid": expected} if expected else {})


def test_an_application_xid_of_a_jobs_crash_is_the_jobs_finding_not_the_gpus() -> None:
    at = (NOW - timedelta(seconds=100)).isoformat()
    crash = PLACE._replace(scope="job", key="ml/train", codes=[13])
    gpu = replace(HEALTHY, xids={13: XidCounts(1, 1, 1, (at,))})
    assert found(judge_xids, xids=gpu.xids) == {"xid": ("degraded", "xid_13", "restart_workload")}
    assert found(judge_xids, xids=gpu.xids, episodes=[crash]) == {}


def test_the_xid_verdict_says_what_resolved_it_and_whom_it_shares_its_fault_with() -> None:
    remedy = {"remedy": "reset_gpu", "by": "plan 7"}
    assert run(judge_xids, replace(HEALTHY, remedy=remedy))["xid"].evidence == {"resolved_by": remedy}
    shared = run(judge_xids, replace(HEALTHY, xids={79: (1, 1)}, episodes=[PLACE]))["xid"].evidence
    assert shared["shared_with"] == {"scope": "node", "key": "n1", "gpus": 2, "hosts": 1}
    assert run(judge_xids, replace(HEALTHY, episodes=[PLACE]))["xid"] == Verdict("xid")  # nothing to share


def test_patterns_write_the_subsystem_each_names() -> None:
    bursts = {
        "remediated_too_often": tuple(
            Burst(NOW - timedelta(days=d), NOW - timedelta(days=d), 1) for d in (1, 2, 3)
        )
    }
    assert found(judge_patterns, pattern_bursts=bursts) == {
        "history": ("unhealthy", "pattern_remediated_too_often", "send_for_repair")
    }
    assert (
        found(judge_patterns, pattern_bursts={"remediated_too_often": bursts["remediated_too_often"][:2]})
        == {}
    )


def test_the_place_caps_what_counting_found_never_the_gpus_own_proof() -> None:
    verdicts: dict[str, Verdict] = {s: Verdict(s) for s in SUBSYSTEMS}
    verdicts["history"] = Verdict("history", "unhealthy", "pattern_remediated_too_often", "send_for_repair")
    verdicts["memory"] = Verdict("memory", "unhealthy", "pattern_x", "send_for_repair")
    cap_at_the_place(Case(replace(HEALTHY, episodes=[PLACE]), RULES, NOW, NOW), verdicts)
    assert verdicts["history"].action == "check_mechanicals"
    assert verdicts["history"].evidence["held_back"] == {
        "from": "send_for_repair",
        "scope": "node",
        "key": "n1",
        "gpus": 2,
    }
    assert verdicts["memory"].action == "send_for_repair"

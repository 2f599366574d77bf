"""The health rules on hand-built features: each verdict, its evidence, actions, scores, alerts."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.cycle import desired_alerts
from services.scorer.predict import TERMS, predict_one
from services.scorer.rules import escalate, evaluate, overall, score
from services.scorer.rules_config import DEFAULT_RULES, PredictorWeights, load_rules
from shared.plumbing.errors import ConfigError
from tests.helpers.scorer import HEALTHY, NOW, RULES


def judge(**changes: Any) -> dict[str, tuple[str, str | None, str]]:
    verdicts = evaluate(replace(HEALTHY, **changes), RULES, NOW)
    return {k: (v.state, v.rule, v.action) for k, v in verdicts.items() if v.state != "healthy"}


def test_a_healthy_gpu_at_full_power_has_no_finding() -> None:
    assert judge() == {}
    assert overall(evaluate(HEALTHY, RULES, NOW)) == ("healthy", "none")
    assert score(evaluate(HEALTHY, RULES, NOW), 0.0, RULES) == (100.0, "A")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"dbe_volatile": 1}, {"memory": ("unhealthy", "volatile_dbe", "reset_gpu")}),
        # Changed by issue 32: these four were inspect; the ladder now has the rung each needs.
        ({"remap_failure": 1}, {"memory": ("unhealthy", "row_remap_failure", "send_for_repair")}),
        ({"retired_pages": 63}, {"memory": ("unhealthy", "retired_pages_limit", "send_for_repair")}),
        ({"retired_pages": 62}, {}),
        ({"retired_pending": 1}, {"memory": ("degraded", "page_retirement_pending", "reset_gpu")}),
        ({"remap_pending": 1}, {"memory": ("degraded", "row_remap_pending", "reset_gpu")}),
        ({"sbe_new": 120}, {"memory": ("degraded", "sbe_rate_high", "restart_workload")}),
        ({"sbe_new": 6000}, {"memory": ("unhealthy", "sbe_storm", "reset_gpu")}),
        ({"temp_max": 83}, {"thermal": ("degraded", "near_slowdown_temperature", "none")}),
        ({"temp_max": 88}, {"thermal": ("unhealthy", "hw_thermal_slowdown", "inspect")}),
        ({"reasons_any": 0x40}, {"thermal": ("unhealthy", "hw_thermal_slowdown", "inspect")}),
        ({"reasons_any": 0x80}, {"power": ("unhealthy", "hw_power_brake", "check_mechanicals")}),
        ({"pcie_new": 150}, {"pcie": ("degraded", "pcie_replays", "none")}),
        ({"pcie_new": 2000}, {"pcie": ("unhealthy", "pcie_replay_storm", "check_mechanicals")}),
        ({"nvlink_crc_new": 200}, {"nvlink": ("degraded", "nvlink_crc_errors", "none")}),
        ({"nvlink_replay_recovery_new": 1}, {"nvlink": ("unhealthy", "nvlink_replay_recovery", "reset_gpu")}),
        ({"xids": {79: (1, 1)}}, {"xid": ("unhealthy", "xid_79", "reboot_node")}),
        ({"xids": {94: (1, 1)}}, {"xid": ("degraded", "xid_94", "restart_workload")}),
        # Changed by issue 32: a code outside NVIDIA's catalogue is inspect (was restart_workload).
        ({"xids": {999: (1, 1)}}, {"xid": ("degraded", "xid_999", "inspect")}),
        # Changed by issue 32: NVIDIA ignores 43, 63, 92 (they were restart_workload, reset_gpu).
        ({"xids": {43: (1, 1), 63: (1, 1), 92: (1, 1)}}, {}),
        # Changed by issue 32: NVIDIA resets for 64 and 109 (they were inspect and restart_workload).
        ({"xids": {64: (1, 1)}}, {"xid": ("unhealthy", "xid_64", "reset_gpu")}),
        ({"xids": {109: (1, 1)}}, {"xid": ("unhealthy", "xid_109", "reset_gpu")}),
        ({"xids": {48: (0, 3)}}, {}),  # aged out of the 24 h XID window
        (
            {"last_time": NOW - timedelta(seconds=120)},
            {"availability": ("unhealthy", "not_reporting", "reboot_node")},
        ),
        ({"last_time": None}, {"availability": ("unhealthy", "not_reporting", "reboot_node")}),
    ],
)
def test_each_rule(changes: dict[str, Any], expected: dict[str, tuple[str, str, str]]) -> None:
    assert judge(**changes) == expected


def test_verdicts_carry_their_evidence_and_use_the_gpus_own_limits() -> None:
    v = evaluate(replace(HEALTHY, temp_max=84, slowdown_c=88), RULES, NOW)
    assert v["thermal"].state == "degraded"
    assert v["thermal"].evidence == {"temp_max_c": 84, "slowdown_c": 88, "window_s": 900, "margin_c": 5}
    assert evaluate(replace(HEALTHY, temp_max=84, slowdown_c=95), RULES, NOW)["thermal"].state == "healthy"
    sbe = evaluate(replace(HEALTHY, sbe_new=240), RULES, NOW)["memory"].evidence
    assert sbe["sbe_per_hour"] == 240.0
    assert sbe["threshold"] == 100


def test_the_same_xid_repeating_climbs_the_ladder() -> None:
    assert judge(xids={79: (1, 1)})["xid"][2] == "reboot_node"
    assert judge(xids={79: (1, 2)})["xid"][2] == "inspect"  # the same XID after a reboot: inspect
    assert judge(xids={48: (1, 2)})["xid"][2] == "reboot_node"
    assert judge(xids={48: (2, 3)})["xid"][2] == "inspect"
    assert escalate("restart_workload", 1) == "reset_gpu"
    assert escalate("none", 5) == "none"
    assert escalate("inspect", 3) == "inspect"


def test_overall_state_action_and_score() -> None:
    verdicts = evaluate(replace(HEALTHY, dbe_volatile=1, pcie_new=150), RULES, NOW)
    assert overall(verdicts) == ("unhealthy", "reset_gpu")
    assert score(verdicts, 0.0, RULES) == (40.0, "D")
    assert score(verdicts, 0.5, RULES) == (30.0, "D")


def test_the_prediction_is_monotone_in_its_precursors_and_explains_itself() -> None:
    # Changed by issue 16: a logistic model over precursors replaced the hazard sum over
    # DBEs, critical XIDs and hot minutes (the failure itself, and heat, are not predictors).
    model = PredictorWeights(intercept=-4.0, weights={"memory_rows_per_day": 1.0, "sbe_growth_per_hour": 0.5})
    calm = predict_one("g", {}, model)
    sick = predict_one("g", {"memory_rows_per_day": 500.0, "sbe_growth_per_hour": 40.0}, model)
    assert 0 < calm.p_fail_7d < calm.p_fail_30d < 0.02
    assert sick.p_fail_30d > 0.5
    assert sick.p_fail_7d < sick.p_fail_30d
    assert [r["factor"] for r in sick.reasons] == ["memory_rows_per_day", "sbe_growth_per_hour"]
    assert calm.reasons == []
    assert set(RULES.predictor.weights) <= set(TERMS)


def test_andon_alerts_beyond_verdicts() -> None:
    idle = replace(HEALTHY, pod="train-0", util_max_idle_window=0.0, idle_minutes=10)
    kinds = {a.kind for a in desired_alerts(idle, evaluate(idle, RULES, NOW), RULES)}
    assert kinds == {"idle_while_allocated"}
    full = replace(HEALTHY, fb_used_mib=80000, power_avg=695)
    assert {a.kind for a in desired_alerts(full, evaluate(full, RULES, NOW), RULES)} == {
        "memory_pressure",
        "power_limit",
    }
    broken = replace(HEALTHY, dbe_volatile=1, temp_max=84)
    alerts = {a.kind: a.severity for a in desired_alerts(broken, evaluate(broken, RULES, NOW), RULES)}
    assert alerts == {"unhealthy_memory": "critical", "thermal": "warning"}
    gone = replace(HEALTHY, pod="train-0", util_max_idle_window=0.0, last_time=NOW - timedelta(hours=1))
    assert "idle_while_allocated" not in {
        a.kind for a in desired_alerts(gone, evaluate(gone, RULES, NOW), RULES)
    }


def test_the_rules_file_is_validated(tmp_path: Path) -> None:
    assert RULES.xid[79].action == "reboot_node"
    broken = tmp_path / "rules.toml"
    broken.write_text(DEFAULT_RULES.read_text().replace('action = "reboot_node"', 'action = "pray"'))
    with pytest.raises(ConfigError, match="pray"):
        load_rules(broken)
    broken.write_text("[windows\n")
    with pytest.raises(ConfigError, match=r"rules\.toml"):
        load_rules(broken)
    with pytest.raises(ConfigError, match="No such file"):
        load_rules(tmp_path / "missing.toml")


@settings(max_examples=200, deadline=None)
@given(
    silent_s=st.integers(min_value=0, max_value=86_400),  # whole seconds: no rounding at the bound
    fleet_silent_s=st.one_of(st.none(), st.integers(min_value=-600, max_value=86_400)),
)
def test_silence_is_measured_against_when_the_fleet_was_last_heard(
    silent_s: int, fleet_silent_s: int | None
) -> None:
    """Not reporting iff the GPU was silent for longer than missing_after_s before the fleet was last
    heard (never later than now: a fleet heard "in the future" is heard now)."""
    heard = None if fleet_silent_s is None else NOW - timedelta(seconds=fleet_silent_s)
    gpu = replace(HEALTHY, last_time=NOW - timedelta(seconds=silent_s))
    verdict = evaluate(gpu, RULES, NOW, heard)["availability"]
    quiet_for = silent_s - max(0, fleet_silent_s or 0)
    assert (verdict.rule == "not_reporting") == (quiet_for > RULES.availability.missing_after_s)
    if fleet_silent_s is not None and fleet_silent_s >= silent_s:
        assert verdict.state == "healthy"  # silent no longer than the fleet: the fleet's silence


def test_a_gpu_never_heard_from_is_not_reporting_whenever_the_fleet_was_heard() -> None:
    assert (
        evaluate(replace(HEALTHY, last_time=None), RULES, NOW, NOW - timedelta(hours=1))["availability"].rule
        == "not_reporting"
    )

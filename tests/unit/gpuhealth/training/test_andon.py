"""The Andon checker: thresholds from the scorer's rules file, each alert's condition, open/resolve."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from gpuhealth.training import AlertKind, AndonChecker, AndonThresholds, GpuStatus
from gpuhealth.training.andon import idle_alert, memory_alert, power_alert, thermal_alert
from services.scorer.rules_config import DEFAULT_RULES, load_rules
from shared.plumbing.errors import ConfigError

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
T = AndonThresholds()
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def status(**readings: float | int | None) -> GpuStatus:
    return GpuStatus(index=0, uuid=UUID, model="NVIDIA H100", time=NOW, **readings)  # type: ignore[arg-type]


def test_thresholds_are_the_rules_files_own_values() -> None:
    rules = load_rules(DEFAULT_RULES)  # the scorer's loader, the scorer's file
    t = AndonThresholds.from_rules()
    assert t.default_slowdown_c == rules.thermal.default_slowdown_c
    assert t.thermal_margin_c == rules.thermal.warn_margin_c
    assert t.memory_used_ratio == rules.memory.fb_used_ratio_alert
    assert t.power_limit_ratio == rules.power.at_limit_ratio_alert
    assert t.idle_util_pct == rules.idle.util_pct_below
    assert t.idle_for_s == rules.idle.for_s
    assert AndonChecker().thresholds == t


def test_an_edited_rules_file_moves_the_thresholds_and_code_overrides_win(tmp_path: Path) -> None:
    text = DEFAULT_RULES.read_text().replace("fb_used_ratio_alert = 0.95", "fb_used_ratio_alert = 0.5")
    assert text != DEFAULT_RULES.read_text()
    (edited := tmp_path / "rules.toml").write_text(text)
    assert AndonThresholds.from_rules(edited).memory_used_ratio == 0.5
    checker = AndonChecker(rules=edited, thermal_c=70, idle_for_s=5)
    assert (checker.thresholds.memory_used_ratio, checker.thresholds.thermal_c) == (0.5, 70)
    assert checker.thresholds.idle_for_s == 5
    assert AndonChecker(T, power_limit_ratio=0.5).thresholds.power_limit_ratio == 0.5


def test_a_broken_rules_file_or_bad_override_is_a_config_error(tmp_path: Path) -> None:
    (bad := tmp_path / "rules.toml").write_text("[memory\n")
    with pytest.raises(ConfigError):
        AndonThresholds.from_rules(bad)
    with pytest.raises(ConfigError, match="unknown"):
        AndonChecker(thermal_limit=3)
    with pytest.raises(ConfigError, match="memory_used_ratio"):
        AndonChecker(memory_used_ratio=1.5)


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


NAMES = ["thermal_c", "memory_used_ratio", "power_limit_ratio", "idle_for_s", "idle_util_pct"]
JUNK = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=3), finite)


@given(name=st.sampled_from(NAMES), value=JUNK)
def test_thresholds_accept_only_finite_numbers_in_range(name: str, value: object) -> None:
    try:
        t = T.override(**{name: value})
    except ConfigError:
        return
    got = getattr(t, name)
    assert isinstance(got, int | float)
    assert not isinstance(got, bool)
    assert math.isfinite(got)


temps = st.one_of(st.none(), st.floats(min_value=0, max_value=250))
slowdowns = st.one_of(st.none(), st.floats(min_value=40, max_value=120))


@given(temp=temps, slowdown=slowdowns, margin=st.floats(min_value=0, max_value=20),
       fixed=st.one_of(st.none(), st.floats(min_value=0, max_value=120)))  # fmt: skip
def test_thermal_fires_exactly_at_or_above_the_limit(
    temp: float | None, slowdown: float | None, margin: float, fixed: float | None
) -> None:
    t = T.override(thermal_margin_c=margin, thermal_c=fixed)
    alert = thermal_alert(status(temp_c=temp, slowdown_c=slowdown), t)
    limit = (
        fixed if fixed is not None else (slowdown if slowdown is not None else T.default_slowdown_c) - margin
    )
    assert (alert is not None) == (temp is not None and temp >= limit)
    if alert is not None:
        assert (alert.kind, alert.value, alert.threshold, alert.gpu_uuid) == (
            AlertKind.THERMAL,
            temp,
            limit,
            UUID,
        )
        at_slowdown = temp is not None and temp >= (
            slowdown if slowdown is not None else T.default_slowdown_c
        )
        assert alert.severity == ("critical" if at_slowdown else "warning")


@given(reasons=st.integers(min_value=0, max_value=0x1FF))
def test_thermal_throttling_reasons_fire_even_when_cool(reasons: int) -> None:
    alert = thermal_alert(status(temp_c=30, clocks_event_reasons=reasons), T)
    thermal = reasons & (Reason.SW_THERMAL_SLOWDOWN | Reason.HW_THERMAL_SLOWDOWN)
    assert (alert is not None) == bool(thermal)
    if alert is not None:
        assert alert.severity == ("critical" if reasons & Reason.HW_THERMAL_SLOWDOWN else "warning")
        assert set(alert.evidence["reasons"]) <= {"sw_thermal_slowdown", "hw_thermal_slowdown"}


@given(used=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
       total=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
       ratio=st.floats(min_value=0.01, max_value=1))  # fmt: skip
def test_memory_pressure_fires_exactly_at_or_above_the_ratio(
    used: float | None, total: float | None, ratio: float
) -> None:
    alert = memory_alert(status(fb_used_mib=used, fb_total_mib=total), T.override(memory_used_ratio=ratio))
    expected = used is not None and bool(total) and used / total >= ratio  # type: ignore[operator]
    assert (alert is not None) == expected
    if alert is not None:
        assert alert.threshold == ratio
        assert alert.value == used / total  # type: ignore[operator]


@given(power=st.one_of(st.none(), st.floats(min_value=0, max_value=2000)),
       limit=st.one_of(st.none(), st.floats(min_value=0, max_value=2000)),
       ratio=st.floats(min_value=0.1, max_value=1.2))  # fmt: skip
def test_power_fires_exactly_at_or_above_the_ratio_of_the_limit(
    power: float | None, limit: float | None, ratio: float
) -> None:
    alert = power_alert(status(power_w=power, power_limit_w=limit), T.override(power_limit_ratio=ratio))
    assert (alert is not None) == (power is not None and bool(limit) and power >= ratio * limit)  # type: ignore[operator]
    if alert is not None:
        assert (alert.value, alert.threshold) == (power, ratio * limit)  # type: ignore[operator]


@given(utils=st.lists(st.one_of(st.none(), st.floats(min_value=0, max_value=100)), min_size=1, max_size=30),
       step_s=st.floats(min_value=0.1, max_value=100), below=st.floats(min_value=0, max_value=50),
       for_s=st.floats(min_value=0, max_value=1000))  # fmt: skip
def test_idle_fires_after_utilisation_stays_below_for_long_enough(
    utils: list[float | None], step_s: float, below: float, for_s: float
) -> None:
    checker = AndonChecker(T.override(idle_util_pct=below, idle_for_s=for_s))
    idle_since: float | None = None
    for i, util in enumerate(utils):
        now = i * step_s
        fired = [a for a in checker.evaluate(status(util_pct=util), now) if a.kind is AlertKind.IDLE]
        idle_since = (
            (idle_since if idle_since is not None else now) if util is not None and util < below else None
        )
        expected = idle_since is not None and now - idle_since >= for_s
        assert bool(fired) == expected, (i, util)
        if fired:
            assert fired[0].value == now - idle_since  # type: ignore[operator]
            assert fired[0].threshold == for_s


def test_idle_alert_needs_a_duration() -> None:
    assert idle_alert(status(util_pct=0), T, None) is None


def test_alerts_open_once_stay_active_and_resolve() -> None:
    checker = AndonChecker(T)
    hot = status(temp_c=90, fb_used_mib=79, fb_total_mib=80)
    first = checker.check([hot], 0)
    assert {a.kind for a in first.opened} == {AlertKind.THERMAL, AlertKind.MEMORY_PRESSURE}
    again = checker.check([hot], 1)
    assert again.opened == []
    assert {a.kind for a in again.active} == {
        AlertKind.THERMAL,
        AlertKind.MEMORY_PRESSURE,
    }
    assert checker.check([], 2).resolved == []  # a GPU that was not read clears nothing
    cooled = checker.check([replace(hot, temp_c=60)], 3)
    assert [a.kind for a in cooled.resolved] == [AlertKind.THERMAL]
    assert [a.kind for a in checker.open_alerts] == [AlertKind.MEMORY_PRESSURE]
    assert [a.kind for a in checker.check([replace(hot, temp_c=91)], 4).opened] == [AlertKind.THERMAL]


def test_an_alert_names_device_value_and_threshold() -> None:
    alert = thermal_alert(status(temp_c=88, slowdown_c=87), T)
    assert alert is not None
    assert alert.device == f"GPU 0 ({UUID})"
    assert (alert.value, alert.threshold, alert.unit, alert.severity) == (88, 82, "C", "critical")
    assert "88 °C" in str(alert)
    assert "limit 82 °C" in str(alert)

"""Escalation and clearing (issue 16): fall-off repeats, application XIDs, time-to-clear, rates per hour."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.escalation import fall_off_action
from services.scorer.features import XidCounts
from services.scorer.rules import evaluate
from tests.helpers.scorer import HEALTHY, NOW, RULES

LOST = (NOW - timedelta(minutes=3)).isoformat()
EARLIER = (NOW - timedelta(hours=6)).isoformat()


def test_a_second_fall_off_the_bus_seen_only_as_lost_and_back_means_inspect() -> None:
    missing = replace(HEALTHY, last_time=NOW - timedelta(minutes=5))
    first = evaluate(replace(missing, lost_times=(LOST,)), RULES, NOW)["availability"]
    assert (first.state, first.rule, first.action) == ("unhealthy", "not_reporting", "reboot_node")
    again = evaluate(replace(missing, lost_times=(LOST, EARLIER)), RULES, NOW)["availability"]
    assert again.action == "inspect"
    assert again.evidence["fall_off_episodes"] == 2
    assert again.evidence["repeats_counted"] == {"xid_79": [], "gpu_lost": [LOST, EARLIER]}


def test_xid_79_and_gpu_lost_of_one_episode_count_once() -> None:
    one = XidCounts(1, 1, 1, (LOST,))
    assert fall_off_action("reboot_node", one, (LOST,)).action == "reboot_node"
    back = evaluate(replace(HEALTHY, xids={79: one}, lost_times=(LOST, EARLIER)), RULES, NOW)["xid"]
    assert (back.state, back.action) == ("unhealthy", "inspect")  # back on the bus, but twice now
    assert back.evidence["repeats_counted"]["gpu_lost"] == [LOST, EARLIER]


APPLICATION = (13, 31, 45)  # NVIDIA: the workload's fault, restart it


def test_application_xids_stay_restart_workload_until_they_repeat_beyond_the_configured_count() -> None:
    limit = RULES.xid_repeats.count
    # Changed by issue 32: beyond the count, 13 and 31 ask for diagnostics (NVIDIA's workflows; with
    # no GPC/TPC from the kernel log a 13 is taken to repeat at one place) and a solo 45 for a reset
    # (all three were reset_gpu).
    beyond_action = {13: "run_diagnostics", 31: "run_diagnostics", 45: "reset_gpu"}
    for code in APPLICATION:
        assert RULES.xid[code].xid_class == "application"
        once = evaluate(replace(HEALTHY, xids={code: (1, 1)}), RULES, NOW)["xid"]
        assert (once.state, once.action) == ("degraded", "restart_workload")
        # Changed by issue 16: two XID 13s used to escalate to reset_gpu.
        stamps = tuple((NOW - timedelta(minutes=10 * k)).isoformat() for k in range(limit + 1))
        at_limit = XidCounts(limit, limit, limit, stamps[:limit])
        assert (
            evaluate(replace(HEALTHY, xids={code: at_limit}), RULES, NOW)["xid"].action == "restart_workload"
        )
        beyond = XidCounts(limit + 1, limit + 1, limit + 1, stamps)
        verdict = evaluate(replace(HEALTHY, xids={code: beyond}), RULES, NOW)["xid"]
        assert verdict.action == beyond_action[code]
        assert verdict.evidence.get("occurrences_in_repeat_window", verdict.evidence.get("solo")) == limit + 1
    # many over a month but few within the repeat window: still the workload's fault
    spread = XidCounts(1, 20, 1, (LOST,))
    assert evaluate(replace(HEALTHY, xids={13: spread}), RULES, NOW)["xid"].action == "restart_workload"


@given(code=st.sampled_from(APPLICATION), total=st.integers(min_value=1, max_value=10_000))
def test_a_single_application_xid_never_escalates_past_restart_workload(code: int, total: int) -> None:
    counts = XidCounts(1, total, 1, ())
    verdict = evaluate(replace(HEALTHY, xids={code: counts}), RULES, NOW)["xid"]
    assert verdict.action == "restart_workload"


def test_each_xid_clears_after_its_own_time_from_the_rules_file() -> None:
    assert RULES.xid_clear_s(13) == RULES.xid[13].clear_after_s == 3600
    assert RULES.xid_clear_s(79) == 86400
    assert RULES.xid_clear_s(999) == RULES.windows.xid_s  # not in the catalogue
    aged = evaluate(replace(HEALTHY, xids={13: XidCounts(0, 1, 0, ())}), RULES, NOW)["xid"]
    assert aged.state == "healthy"
    live = evaluate(replace(HEALTHY, xids={13: XidCounts(1, 1, 1, ())}), RULES, NOW)["xid"]
    assert live.evidence["window_s"] == 3600


@settings(max_examples=60)
@given(
    per_hour=st.floats(min_value=0, max_value=20_000, allow_nan=False),
    poll_s=st.sampled_from([10, 30, 60, 120, 300, 600]),
)
def test_rates_are_per_elapsed_hour_whatever_the_poll_cadence(per_hour: float, poll_s: int) -> None:
    # One hour window: rows every poll_s (at most one per minute bucket); the counter grows
    # at per_hour. The old rule divided by the number of rows, doubling the rate at 120 s.
    buckets = max(1, 3600 // max(poll_s, 60))
    span = (buckets - 1) * max(poll_s, 60)
    new = round(per_hour * span / 3600)
    g = replace(HEALTHY, sbe_new=new, minutes_long=buckets, span_long_s=float(span))
    verdict = evaluate(g, RULES, NOW)["memory"]
    expected = new * 3600 / max(span, 600)
    if expected >= RULES.memory.sbe_per_hour_warn:
        assert verdict.evidence["sbe_per_hour"] == round(expected, 1)
    else:
        assert verdict.state == "healthy"
    if span >= 600:  # the rate read back is the stream's, within one count of rounding
        assert abs(expected - per_hour) <= 3600 / span

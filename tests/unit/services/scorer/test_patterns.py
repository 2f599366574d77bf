"""Pattern rules: counts within a window, bursts counted once, sticky findings, cancellation, the evidence."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.patterns import Burst, judge_pattern, occurrences, pattern_queries
from services.scorer.rules import evaluate
from services.scorer.rules_config import DEFAULT_RULES, Pattern, load_rules
from shared.plumbing.errors import ConfigError
from tests.helpers.scorer import HEALTHY, NOW, RULES

DAY = 86400.0


def pattern(**changes: object) -> Pattern:
    base = {"name": "p", "counts": ["xid:79"], "window_s": DAY, "at_least": 3, "state": "unhealthy",
            "action": "send_for_repair", "why": "test"}  # fmt: skip
    return Pattern.model_validate({**base, **changes})


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def burst(start_ago: float, span_s: float = 0.0, lines: int = 1) -> Burst:
    return Burst(ago(start_ago), ago(start_ago - span_s), lines)


def test_a_count_within_the_window_fires_and_names_what_it_counted() -> None:
    p = pattern(burst_s=60)
    three = (burst(100, lines=4), burst(5000), burst(80000))
    found = judge_pattern(p, three, None, NOW)
    assert found is not None
    assert (found.evidence["pattern"], found.evidence["counted"], found.evidence["at_least"]) == ("p", 3, 3)
    assert [o["lines"] for o in found.evidence["occurrences"]] == [4, 1, 1]  # newest first
    assert judge_pattern(p, three[:2], None, NOW) is None
    assert (
        judge_pattern(p, (*three[:2], burst(DAY + 10)), None, NOW) is None
    )  # the third is out of the window


def test_a_burst_counts_once_per_burst_window_it_spans() -> None:
    p = pattern(burst_s=60, at_least=2)
    flood = burst(200, span_s=59, lines=100_000)  # 100,000 lines within a minute: one occurrence
    assert occurrences(flood, 60) == 1
    assert judge_pattern(p, (flood,), None, NOW) is None
    long = burst(600, span_s=150, lines=40)  # a stream for two and a half minutes: three
    assert occurrences(long, 60) == 3
    assert judge_pattern(p, (long,), None, NOW) is not None
    assert occurrences(Burst(NOW, NOW, 7), 0) == 7  # no burst window: every signal counts


def test_a_sticky_finding_outlives_its_window_and_a_cancelling_signal_closes_it() -> None:
    p = pattern(window_s=3600, sticky_s=DAY)
    old = (burst(7000), burst(6900), burst(6800))  # reached the count almost two hours ago
    assert judge_pattern(pattern(window_s=3600), old, None, NOW) is None
    held = judge_pattern(p, old, None, NOW)
    assert held is not None
    assert held.evidence["sticky_until"] == (ago(6800) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert held.evidence["counted"] == 3  # what it counted when it was reached
    assert judge_pattern(p, old, ago(6850), NOW) is None  # repaired after the second: the count restarts
    assert judge_pattern(p, old, ago(100), NOW) is None


def test_the_rules_file_patterns_are_findings_of_the_gpus_history() -> None:
    bursts: dict[str, tuple[Burst, ...]] = {"dbe_recurring": (burst(100), burst(10 * DAY))}
    record = evaluate(replace(HEALTHY, pattern_bursts=bursts), RULES, NOW)["history"]
    assert (record.state, record.rule, record.action) == (
        "unhealthy",
        "pattern_dbe_recurring",
        "run_diagnostics",
    )
    fixed: dict[str, tuple[Burst, ...]] = {
        "remediated_too_often": (burst(100), burst(2 * DAY), burst(4 * DAY))
    }
    history = evaluate(replace(HEALTHY, pattern_bursts=fixed), RULES, NOW)["history"]
    assert (history.rule, history.action) == ("pattern_remediated_too_often", "send_for_repair")
    assert history.evidence["counts"] == ["recovered", "event:gpu_back"]


def test_what_the_database_is_asked_for() -> None:
    rows, kinds, reach = pattern_queries(RULES)
    by_name = {p.name: row for p, row in zip(RULES.patterns, rows, strict=True)}
    assert by_name["remediated_too_often"]["kinds"] == ["gpu_back", "recovered"]
    assert by_name["flapping"]["kinds"] == ["changed"]
    hardware = by_name["hardware_xids_recurring"]["codes"]
    assert 79 in hardware  # a class counts its codes that are findings
    assert 63 not in hardware
    assert 13 not in hardware
    assert {"xid", "ecc_dbe", "gpu_back", "recovered", "changed"} <= set(kinds)
    assert reach == max(p.window_s + p.sticky_s for p in RULES.patterns)


def test_a_rule_may_count_the_remediators_own_plans() -> None:
    """`remediated`: a live plan of the remediator's (services/remediator) that took the GPU's node out."""
    fields = RULES.patterns[0].model_dump() | {"counts": ["remediated"], "cancelled_by": ["remediated"]}
    counting = type(RULES.patterns[0]).model_validate(fields)  # the rules file's own check
    rows, kinds, _ = pattern_queries(RULES.model_copy(update={"patterns": [counting]}))
    assert (rows[0]["kinds"], rows[0]["cancel_kinds"], kinds) == (
        ["remediated"],
        ["remediated"],
        ("remediated",),
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ('counts = ["xid:149"]', 'counts = ["xid:nope"]'),
        ('counts = ["xid:149"]', 'counts = ["event:Bad Kind"]'),
        ('name = "nvlink5_link_down_daily"', 'name = "dbe_recurring"'),
        ('action = "inspect"\nwhy = "NVIDIA', 'action = "pray"\nwhy = "NVIDIA'),
    ],
)
def test_a_broken_pattern_is_refused(tmp_path: Path, edit: str, message: str) -> None:
    rules = tmp_path / "health-rules.toml"
    text = DEFAULT_RULES.read_text()
    assert edit in text
    rules.write_text(text.replace(edit, message, 1))
    for name in ("predictor-weights.toml", "xid-catalog.csv", "nvlink5-decode.csv"):
        (tmp_path / name).write_text((DEFAULT_RULES.parent / name).read_text())
    with pytest.raises(ConfigError, match="patterns"):
        load_rules(rules)


# Property tests: the windows against a direct count of occurrences at every instant that matters.
bursts_strategy = st.lists(
    st.tuples(st.floats(min_value=0, max_value=5 * DAY), st.floats(min_value=0, max_value=900),
              st.integers(min_value=1, max_value=50)),
    max_size=25,
).map(lambda xs: tuple(burst(start + span, span, lines) for start, span, lines in xs))  # fmt: skip


def count_at(p: Pattern, bursts: tuple[Burst, ...], at: datetime) -> int:
    window = timedelta(seconds=p.window_s)
    return sum(occurrences(b, p.burst_s) for b in bursts if at - window < b.last <= at)


@settings(max_examples=300)
@given(
    bursts=bursts_strategy,
    window_s=st.floats(min_value=60, max_value=3 * DAY),
    burst_s=st.sampled_from([0.0, 10.0, 60.0, 600.0]),
    at_least=st.integers(min_value=1, max_value=8),
    sticky_s=st.sampled_from([0.0, 3600.0, DAY]),
    cancel_ago=st.none() | st.floats(min_value=0, max_value=5 * DAY),
)
def test_a_finding_holds_exactly_when_the_windows_say(
    bursts: tuple[Burst, ...], window_s: float, burst_s: float, at_least: int, sticky_s: float,
    cancel_ago: float | None,
) -> None:  # fmt: skip
    p = pattern(window_s=window_s, burst_s=burst_s, at_least=at_least, sticky_s=sticky_s)
    cancelled = ago(cancel_ago) if cancel_ago is not None else None
    live = tuple(b for b in bursts if cancelled is None or b.last > cancelled)
    reached = [b.last for b in live if count_at(p, live, b.last) >= at_least]
    expected = count_at(p, live, NOW) >= at_least or any(
        sticky_s > 0 and (NOW - t).total_seconds() <= sticky_s for t in reached
    )
    found = judge_pattern(p, bursts, cancelled, NOW)
    assert (found is not None) == expected
    if found is not None:
        assert found.evidence["counted"] >= at_least
        assert len(found.evidence["occurrences"]) <= 10
    # more occurrences never close a finding; a cancel only ever closes one
    if found is not None:
        assert judge_pattern(p, (*bursts, burst(1)), cancelled, NOW) is not None
    if judge_pattern(p, bursts, None, NOW) is None:
        assert found is None


@settings(max_examples=100)
@given(lines=st.integers(min_value=1, max_value=10**6), span=st.floats(min_value=0, max_value=59.9))
def test_how_many_lines_a_burst_had_never_changes_its_count(lines: int, span: float) -> None:
    assert occurrences(burst(100, span, lines), 60) == 1

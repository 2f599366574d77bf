"""A job's crash owns its GPUs' application XIDs only when every recent occurrence falls within it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from services.scorer.correlation import correlated_alerts, job_owns
from services.scorer.features import XidCounts
from services.scorer.patterns import Burst
from services.scorer.rules import Verdict, evaluate, hold_back_for_the_place
from shared.contract.models_health import LADDER, SUBSYSTEMS, Action
from shared.store.correlated_inputs import Episode
from tests.helpers.scorer import HEALTHY, NOW, RULES

CRASH = Episode("job", "ml/train-3f2a", NOW - timedelta(seconds=300), NOW - timedelta(seconds=290),
                ["GPU-1", "GPU-2"], ["n1"], [13, 45], 4)  # fmt: skip


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat()


def test_the_crashs_xids_are_no_finding_of_the_gpu_but_a_later_one_is() -> None:
    inside = XidCounts(1, 1, 1, (stamp(295),))
    gpu = replace(HEALTHY, episodes=[CRASH], xids={13: inside})
    assert evaluate(gpu, RULES, NOW)["xid"].state == "healthy"
    again = XidCounts(2, 2, 2, (stamp(60), stamp(295)))  # the GPU alone, a minute ago
    assert evaluate(replace(gpu, xids={13: again}), RULES, NOW)["xid"].state == "degraded"
    assert evaluate(replace(gpu, xids={48: inside}), RULES, NOW)["xid"].state == "unhealthy"  # not an app XID


def test_the_first_gpu_of_an_episode_holds_its_one_alert() -> None:
    first = replace(HEALTHY, gpu_uuid="GPU-1", episodes=[CRASH])
    ((kind, severity, summary, evidence),) = correlated_alerts(first)
    assert (kind, severity, evidence["job"], evidence["gpu_count"]) == (
        "job_crash",
        "warning",
        "ml/train-3f2a",
        2,
    )
    assert "ml/train-3f2a" in summary
    assert correlated_alerts(replace(first, gpu_uuid="GPU-2")) == []


@given(
    times=st.lists(st.integers(min_value=0, max_value=7200), max_size=10),
    first=st.integers(min_value=0, max_value=7200),
    span=st.integers(min_value=0, max_value=600),
)
def test_a_job_owns_exactly_the_recent_occurrences_inside_its_crash(
    times: list[int], first: int, span: int
) -> None:
    crash = CRASH._replace(first=NOW - timedelta(seconds=first + span), last=NOW - timedelta(seconds=first))
    counts = XidCounts(len(times), len(times), len(times), tuple(stamp(t) for t in times))
    owned = job_owns(replace(HEALTHY, episodes=[crash]), 13, counts, NOW, RULES)
    clear = RULES.xid_clear_s(13)
    recent = [t for t in times if t < clear]
    assert owned == all(first <= t <= first + span for t in recent)
    assert not job_owns(replace(HEALTHY, episodes=[crash]), 31, counts, NOW, RULES)


PLACE = Episode("rack", "rack-07", NOW - timedelta(seconds=120), NOW - timedelta(seconds=60),
                ["GPU-1", "GPU-2", "GPU-3"], ["n1", "n2"], [79], 6)  # fmt: skip


@given(
    actions=st.dictionaries(
        st.sampled_from(SUBSYSTEMS),
        st.tuples(st.sampled_from(LADDER), st.sampled_from(["pattern_x", "xid_48"])),
    ),
    scopes=st.lists(st.sampled_from(["job", "node", "rack"]), max_size=3),
)
def test_a_place_fault_holds_its_gpus_counted_findings_at_the_places_rung(
    actions: dict[str, tuple[Action, str]], scopes: list[str]
) -> None:
    episodes = [PLACE._replace(scope=scope) for scope in scopes]
    verdicts = {s: Verdict(s, "unhealthy", rule, a, {"x": 1}) for s, (a, rule) in actions.items()}
    hold_back_for_the_place(replace(HEALTHY, episodes=episodes), verdicts)
    placed = any(scope != "job" for scope in scopes)
    ceiling = LADDER.index("check_mechanicals")
    for subsystem, (before, rule) in actions.items():
        verdict = verdicts[subsystem]
        counted = rule.startswith("pattern_")  # a failed remap (xid_48's workflow) is the GPU's own proof
        held = placed and counted and subsystem != "memory" and LADDER.index(before) > ceiling
        assert verdict.action == ("check_mechanicals" if held else before)
        assert ("held_back" in verdict.evidence) == held
        if held:
            assert verdict.evidence["held_back"]["from"] == before
            assert verdict.evidence["held_back"]["key"] == "rack-07"
            assert verdict.evidence["x"] == 1  # what the finding said stays


def test_a_rack_fault_turns_each_gpus_repair_into_one_visit_to_the_rack() -> None:
    # the remediator took the GPU's node out three times in a week: the rule sends it for repair,
    # unless its rack is at fault (the rack's power, not the GPU, kept failing)
    bursts = tuple(Burst(NOW - timedelta(days=d), NOW - timedelta(days=d), 2) for d in (1, 2, 3))
    gpu = replace(HEALTHY, gpu_uuid="GPU-1", pattern_bursts={"remediator_acted_too_often": bursts})
    alone = evaluate(gpu, RULES, NOW)
    repaired = [v for v in alone.values() if v.action == "send_for_repair"]
    assert repaired, {s: v.action for s, v in alone.items()}
    shared = evaluate(replace(gpu, episodes=[PLACE]), RULES, NOW)
    assert all(v.action != "send_for_repair" for s, v in shared.items() if s != "memory")
    assert any(v.evidence.get("held_back", {}).get("scope") == "rack" for v in shared.values())

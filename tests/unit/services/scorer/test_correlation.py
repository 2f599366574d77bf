"""A job's crash owns its GPUs' application XIDs only when every recent occurrence falls within it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from services.scorer.correlation import correlated_alerts, job_owns
from services.scorer.features import XidCounts
from services.scorer.rules import evaluate
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

"""The usage question's own checks, and the rollup's idle threshold against the scorer's rules."""

from __future__ import annotations

import re
import tomllib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.plumbing.migrate import SCHEMA_DIR
from shared.settings.common import HEALTH_RULES_FILE
from shared.store.usage import DIMENSIONS, UsageQuery

T0 = datetime(2026, 5, 4, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_the_rollup_counts_idle_below_the_scorers_idle_threshold() -> None:
    migration = (SCHEMA_DIR / "0050_usage.sql").read_text()
    busy = re.findall(r"gpu_util_pct >= (\d+(?:\.\d+)?) THEN 1 ELSE 0 END\)\s+AS busy_samples", migration)
    idle = re.findall(r"gpu_util_pct < (\d+(?:\.\d+)?) THEN 1 ELSE 0 END\)\s+AS idle_samples", migration)
    with HEALTH_RULES_FILE.open("rb") as f:
        below = tomllib.load(f)["idle"]["util_pct_below"]
    assert [float(v) for v in busy + idle] == [float(below)] * 2


def test_a_question_it_cannot_answer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="grouped by"):
        UsageQuery(start=T0, end=T0 + HOUR, by="colour")
    with pytest.raises(ValueError, match="filtered by"):
        UsageQuery(start=T0, end=T0 + HOUR, filters={"team": "x"})
    with pytest.raises(ValueError, match="a minute"):
        UsageQuery(start=T0, end=T0 + HOUR, max_gap=timedelta(seconds=30))
    with pytest.raises(ValueError, match="before its end"):
        UsageQuery(start=T0, end=T0)
    with pytest.raises(ValueError, match="a minute or more"):
        UsageQuery(start=T0, end=T0 + HOUR, step=timedelta(seconds=10))


@given(
    by=st.text(max_size=20), filters=st.dictionaries(st.text(max_size=12), st.text(max_size=8), max_size=3)
)
def test_only_the_known_dimensions_are_taken(by: str, filters: dict[str, str]) -> None:
    known = by in DIMENSIONS and set(filters) <= set(DIMENSIONS)
    try:
        UsageQuery(start=T0, end=T0 + HOUR, by=by, filters=filters)
    except ValueError:
        assert not known
    else:
        assert known

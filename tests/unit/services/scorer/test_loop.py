"""The scorer's settings refuse an `as_of` it could only fail on later, every cycle."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from services.scorer.settings import ScorerSection


@pytest.mark.parametrize("value", ["now", "latest", "2026-11-01T00:00:00Z", "2026-11-01 12:30:00+02:00"])
def test_now_latest_and_iso_times_are_taken(value: str) -> None:
    assert ScorerSection(as_of=value).as_of == value


@given(st.datetimes(timezones=st.just(UTC)) | st.datetimes())
def test_any_iso_time_is_taken(when: datetime) -> None:
    assert ScorerSection(as_of=when.isoformat()).as_of == when.isoformat()


@pytest.mark.parametrize("value", ["yesterday", "", "NOW", "2026-13-01", "latest ", "\x00"])
def test_anything_else_is_refused_when_settings_load(value: str) -> None:
    with pytest.raises(ValidationError, match="as_of must be"):
        ScorerSection(as_of=value)


@given(st.text(max_size=30).filter(lambda t: t not in ("now", "latest")))
def test_text_that_is_no_time_is_refused(text: str) -> None:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        with pytest.raises(ValidationError):
            ScorerSection(as_of=text)
    else:
        assert ScorerSection(as_of=text).as_of == text

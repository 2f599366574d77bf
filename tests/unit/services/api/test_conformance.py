"""What the schema promises, kept: CSV cells that run nothing (one function for every export), date-times
with four-digit years, and times in the query that are date-times, not Unix times."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from services.api.export import FORMULA_START, csv_cell, iso_z
from services.api.paging import z_time
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


@given(text=st.text(max_size=50))
def test_a_string_cell_never_starts_a_formula_and_reads_back_whole(text: str) -> None:
    cell = csv_cell(text)
    assert not cell.startswith(FORMULA_START)
    assert cell in (text, "'" + text)
    out = io.StringIO()
    csv.writer(out).writerow([cell])
    assert next(csv.reader(io.StringIO(out.getvalue()))) == [cell]


@given(number=st.floats(allow_nan=False) | st.integers())
def test_numbers_stay_numbers_even_negative(number: float) -> None:
    assert csv_cell(number) == (repr(number) if isinstance(number, float) else str(number))


@pytest.mark.parametrize("attack", ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"])
def test_formula_strings_are_neutralised(attack: str) -> None:
    assert csv_cell(attack) == "'" + attack


@given(when=st.datetimes(min_value=datetime(1, 1, 2), timezones=st.just(UTC)))
def test_every_time_is_an_rfc_3339_date_time_years_below_1000_included(when: datetime) -> None:
    assert RFC3339.match(z_time(when)), z_time(when)
    assert datetime.fromisoformat(z_time(when)) == when
    assert iso_z(datetime(999, 1, 2, tzinfo=UTC)) == "0999-01-02T00:00:00Z"
    assert z_time(datetime(9, 1, 2, tzinfo=UTC)) == "0009-01-02T00:00:00.000000Z"


@pytest.fixture(scope="module")
def client() -> TestClient:
    """The app, never started: validation answers before any connection is asked for."""
    return TestClient(api_app(DatabaseSettings()), headers=as_role("viewer"))


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-1", "1e9", "yesterday"])
def test_a_number_is_not_taken_as_a_unix_time(client: TestClient, value: str) -> None:
    for name in ("from", "to"):
        refused = client.get("/api/v1/events", params={name: value})
        assert refused.status_code == 422, refused.text
        assert name in refused.json()["detail"]


def test_an_old_records_commands_and_urls_are_not_answered() -> None:
    from services.api.routes.remediations import without_commands

    old = {"runs": [{"argv": ["ssh", "n1", "--token", "x"], "ok": True}, {"url": "https://u:p@j", "ok": 0}]}
    assert without_commands(old) == {"runs": [{"ok": True}, {"ok": 0}]}
    assert without_commands({"node": "n1"}) == {"node": "n1"}

"""The query models: each refuses every name it does not take (naming what it takes), and holds its bounds.

The models are checked alone (hypothesis over names and values) and through the
app, whose validation answers before any database is reached: an unknown name
on any endpoint is a 422 that names it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.api.parameters import (
    BUCKET_SECONDS,
    LABEL,
    AlertsQuery,
    Bucket,
    EventsQuery,
    FleetProcessesQuery,
    GpuListQuery,
    GpuTimelineQuery,
    LifecycleFilters,
    LifecycleQuery,
    LlmTimelineQuery,
    NoQuery,
    PageQuery,
    PlansQuery,
    PredictionsQuery,
    QueryModel,
    SeriesQuery,
    SystemsQuery,
    UsageExportQuery,
    UsageQuery,
    UsageTimelineQuery,
    VerificationsQuery,
    WindowQuery,
    time_range,
)
from services.api.routes.history import fit_bucket
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role

MODELS: list[type[QueryModel]] = [
    NoQuery, GpuListQuery, SeriesQuery, EventsQuery, AlertsQuery, PredictionsQuery, PageQuery,
    VerificationsQuery, SystemsQuery, FleetProcessesQuery, WindowQuery, PlansQuery, LifecycleFilters,
    LifecycleQuery,
    UsageQuery, UsageTimelineQuery, UsageExportQuery, GpuTimelineQuery, LlmTimelineQuery,
]  # fmt: skip
# Each model's integer and float fields with their bounds: (field, lowest, highest).
BOUNDS: dict[type[QueryModel], list[tuple[str, float, float]]] = {
    GpuListQuery: [("limit", 1, 1000), ("offset", 0, 1_000_000)],
    EventsQuery: [("limit", 1, 1000)],
    AlertsQuery: [("limit", 1, 1000)],
    PredictionsQuery: [("limit", 1, 1000), ("min_p30", 0, 1)],
    PageQuery: [("limit", 1, 1000)],
    VerificationsQuery: [("limit", 1, 1000)],
    SystemsQuery: [("limit", 1, 10_000)],
    GpuTimelineQuery: [("limit", 1, 5000)],
    PlansQuery: [("limit", 1, 1000)],
    LifecycleFilters: [("min_waiting", 0, 1e12)],
    LifecycleQuery: [("limit", 1, 1000), ("min_waiting", 0, 1e12)],
}
NAMES = st.text(st.characters(codec="utf-8"), min_size=0, max_size=30)


def refusal(model: type[QueryModel], data: dict[str, Any]) -> list[Any]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    return refused.value.errors()


def subclasses(model: type[QueryModel]) -> set[type[QueryModel]]:
    return {model, *(c for sub in model.__subclasses__() for c in subclasses(sub))}


def test_every_query_model_is_checked() -> None:
    assert subclasses(QueryModel) - {QueryModel} == set(MODELS)


@given(model=st.sampled_from(MODELS), name=NAMES, value=st.text(max_size=10))
def test_a_name_the_model_does_not_take_is_refused_and_named(
    model: type[QueryModel], name: str, value: str
) -> None:
    if name in model.query_names():
        return
    (error,) = refusal(model, {name: value})
    assert error["type"] == "unknown_query_parameter"
    assert repr(name) in error["msg"]
    takes = model.query_names()
    assert (
        all(repr(n) in error["msg"] for n in takes) if takes else "takes no query parameters" in error["msg"]
    )


@pytest.mark.parametrize("model", MODELS)
def test_field_names_behind_an_alias_are_not_taken(model: type[QueryModel]) -> None:
    """`from`/`to` in the query string; `start`/`end` are the fields' names, not names a client may use."""
    for name, field in model.model_fields.items():
        if field.alias:
            assert refusal(model, {name: "2026-01-01T00:00:00Z"})[0]["type"] == "unknown_query_parameter"
    assert model.model_validate({}) == model()  # every parameter is optional


@given(data=st.data())
@settings(max_examples=300)
def test_numbers_are_held_to_their_bounds(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(list(BOUNDS)))
    name, lowest, highest = data.draw(st.sampled_from(BOUNDS[model]))
    is_float = name == "min_p30"
    value = data.draw(
        st.floats(allow_nan=True, allow_infinity=True)
        if is_float
        else st.integers(min_value=-(2**70), max_value=2**70)
    )
    inside = lowest <= value <= highest  # NaN is inside nothing
    if inside:
        assert getattr(model.model_validate({name: str(value)}), name) == value
    else:
        assert refusal(model, {name: str(value)})[0]["loc"] == (name,)


@given(value=st.text(max_size=300))
def test_a_label_is_a_plain_name(value: str) -> None:
    if re.fullmatch(LABEL, value):
        assert GpuListQuery.model_validate({"host": value}).host == value
    else:
        assert refusal(GpuListQuery, {"host": value})[0]["loc"] == ("host",)


@given(value=st.text(max_size=600))
def test_a_cursor_is_base64url_of_bounded_length(value: str) -> None:
    if re.fullmatch(r"[A-Za-z0-9_-]+", value) and len(value) <= 512:
        assert AlertsQuery.model_validate({"cursor": value}).cursor == value
    else:
        assert refusal(AlertsQuery, {"cursor": value})[0]["loc"] == ("cursor",)


@given(value=st.text(max_size=12) | st.sampled_from(["score", "-temp", "hostname", "temp; --", "SCORE"]))
def test_sort_and_bucket_take_only_their_values(value: str) -> None:
    sorts = ["score", "-score", "hostname", "-hostname", "temp", "-temp", "power", "-power"]
    if value in sorts:
        assert GpuListQuery.model_validate({"sort": value}).sort == value
    else:
        assert refusal(GpuListQuery, {"sort": value})[0]["loc"] == ("sort",)
    if value in BUCKET_SECONDS:
        assert SeriesQuery.model_validate({"bucket": value}).bucket == value
    else:
        assert refusal(SeriesQuery, {"bucket": value})[0]["loc"] == ("bucket",)


@given(by=st.sampled_from(["namespace", "user", "class"]), cls=st.sampled_from([None, "training", "none"]))
def test_usage_takes_class_by_its_name_and_hands_on_only_the_filters_given(by: str, cls: str | None) -> None:
    given = {"by": by, "namespace": "ml", **({"class": cls} if cls else {})}
    assert UsageQuery.model_validate(given).filters() == {
        "namespace": "ml",
        **({"class": cls} if cls else {}),
    }
    assert refusal(UsageQuery, {"class": "mining"})[0]["loc"] == ("class",)


TIMES = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))


def ordered_and_bounded(start: datetime | None, end: datetime | None, max_days: int) -> bool:
    """Whether time_range takes start..end: in the calendar once defaulted, ordered, at most max_days long."""
    try:
        last = end or datetime.now(UTC)
        first = start or last - timedelta(hours=24)
    except OverflowError:
        return False
    return first < last and last - first <= timedelta(days=max_days)


@given(start=st.none() | TIMES, end=st.none() | TIMES, max_days=st.integers(1, 3650))
def test_a_time_range_is_ordered_and_bounded_or_a_400(
    start: datetime | None, end: datetime | None, max_days: int
) -> None:
    if not ordered_and_bounded(start, end, max_days):
        with pytest.raises(HTTPException, match=r"'from'|'to'|at most") as refused:
            time_range(start, end, default=timedelta(hours=24), max_days=max_days)
        assert refused.value.status_code == 400
        return
    first, last = time_range(start, end, default=timedelta(hours=24), max_days=max_days)
    assert first < last <= (end or datetime.now(UTC))
    assert last - first <= timedelta(days=max_days)
    assert first == (start or last - timedelta(hours=24))


def test_a_naive_time_is_utc() -> None:
    assert time_range(datetime(2026, 1, 1), datetime(2026, 1, 2), default=timedelta(1), max_days=2) == (
        datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC),
    )  # fmt: skip


@given(
    bucket=st.sampled_from(list(BUCKET_SECONDS)),
    span_s=st.integers(1, 10 * 365 * 86400),
    max_points=st.integers(10, 100_000),
)
def test_the_series_bucket_is_widened_to_fit_max_points(bucket: Bucket, span_s: int, max_points: int) -> None:
    end = datetime(2026, 1, 1, tzinfo=UTC)
    used, start = fit_bucket(bucket, end - timedelta(seconds=span_s), end, max_points)
    assert BUCKET_SECONDS[used] >= BUCKET_SECONDS[bucket]
    assert (end - start).total_seconds() / BUCKET_SECONDS[used] <= max_points
    assert start >= end - timedelta(seconds=span_s)


@pytest.fixture(scope="module")
def client() -> TestClient:
    """The app, never started: validation answers before any connection is asked for."""
    return TestClient(api_app(DatabaseSettings()), headers=as_role("viewer"))


def query_names(client: TestClient) -> dict[str, list[str]]:
    """Each GET under /api/v1 (path values filled in) -> the query names its OpenAPI entry lists."""
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    filled = {
        "{gpu_uuid}": "GPU-11111111-2222-3333-4444-555555555555",
        "{hostname}": "node-0",
        "{plan_id}": "1",
    }
    return {
        re.sub(r"\{\w+\}", lambda m: filled[m.group(0)], path): sorted(
            p["name"] for p in ops["get"].get("parameters", []) if p["in"] == "query"
        )
        for path, ops in paths.items()
        if "get" in ops and path.startswith("/api/v1")
    }


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_every_endpoint_answers_an_unknown_name_with_a_422_naming_it(
    client: TestClient, data: st.DataObject
) -> None:
    endpoints = query_names(client)
    path = data.draw(st.sampled_from(sorted(endpoints)))
    name = data.draw(
        st.from_regex(r"[A-Za-z_.\[\]-]{1,12}", fullmatch=True).filter(lambda n: n not in endpoints[path])
    )
    reply = client.get(path, params={name: "1"})
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    assert f"unknown query parameters [{name!r}]" in detail
    assert f"takes {endpoints[path]}" in detail if endpoints[path] else "takes no query parameters" in detail

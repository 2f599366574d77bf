"""shared.store.history against a migrated schema: a GPU's series (raw and rollup) and the event list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from shared.plumbing.db import connect
from shared.plumbing.errors import DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store import history
from shared.store.history import COUNTERS, EventFilters
from tests.helpers.store_rows import T0, gpu, on_async


@pytest.fixture
def ten_minutes(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> DatabaseSettings:
    """GPU 0: a raw sample every 10 s and a rollup minute every minute for 10 minutes from T0; six events."""
    for s in range(0, 600, 10):
        conn.execute(
            "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c,"
            " ecc_sbe_volatile_total) VALUES (%s, %s, 'node-a', 'mock', 'test', %s, %s)",
            (T0 + timedelta(seconds=s), gpu(0), 50 + s / 60, s // 60),
        )
    for m in range(10):
        conn.execute(
            "INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n,"
            " gpu_temp_c_max, ecc_sbe_volatile_total_max) VALUES (%s, %s, 6, %s, 6, %s, %s)",
            (T0 + timedelta(minutes=m), gpu(0), 6 * (50 + m), 51 + m, m),
        )
    for n, kind in enumerate(["xid", "xid", "gpu_lost", "gpu_back", "ecc_dbe", "xid"]):
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, %s, 'node-a', 'mock', 'test', %s)",
            (T0 + timedelta(minutes=n), gpu(n % 2), kind, Jsonb({"n": n})),
        )
    conn.commit()
    return migrated


def test_fine_buckets_read_raw_samples_and_coarse_ones_the_rollup(ten_minutes: DatabaseSettings) -> None:
    end = T0 + timedelta(minutes=10)
    raw = on_async(ten_minutes, lambda c: history.series(c, gpu(0), start=T0, end=end, bucket_s=30))
    assert len(raw) == 20
    assert raw[0]["t"] == T0
    assert list(raw[0])[5:] == list(COUNTERS)
    rolled = on_async(ten_minutes, lambda c: history.series(c, gpu(0), start=T0, end=end, bucket_s=300))
    assert [(p["t"], p["temp_c"], p["temp_max_c"], p["ecc_sbe"]) for p in rolled] == [
        (T0, 52.0, 55, 4),
        (T0 + timedelta(minutes=5), 57.0, 60, 9),
    ]
    with connect(ten_minutes) as c:
        assert history.series_sync(c, gpu(0), start=T0, end=end, bucket_s=300) == rolled
    assert on_async(ten_minutes, lambda c: history.series(c, gpu(1), start=T0, end=end, bucket_s=60)) == []


def test_events_page_newest_first(ten_minutes: DatabaseSettings) -> None:
    window = EventFilters(start=T0, end=T0 + timedelta(hours=1))
    first, total = on_async(ten_minutes, lambda c: history.events(c, window, limit=2, after=None))
    assert total == 6
    assert [e["details"]["n"] for e in first] == [5, 4]
    key = (first[-1]["time"], first[-1]["gpu_uuid"], first[-1]["kind"])
    rest, _ = on_async(ten_minutes, lambda c: history.events(c, window, limit=10, after=key))
    assert [e["details"]["n"] for e in rest] == [3, 2, 1, 0]
    xids = EventFilters(start=T0, end=T0 + timedelta(hours=1), gpu=gpu(0), kind="xid")
    assert on_async(ten_minutes, lambda c: history.events(c, xids, limit=10, after=None))[1] == 1


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.datetimes(timezones=st.just(UTC)),
    span=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=60)),
    gpu_text=st.none() | st.text(max_size=40) | st.just(gpu(1)),
    kind=st.none() | st.text(max_size=20),
    after=st.none()
    | st.tuples(st.datetimes(timezones=st.just(UTC)), st.text(max_size=40), st.text(max_size=20)),
)
def test_hostile_time_ranges_filters_and_cursors(
    ten_minutes: DatabaseSettings,
    start: datetime,
    span: timedelta,
    gpu_text: str | None,
    kind: str | None,
    after: tuple[datetime, str, str] | None,
) -> None:
    try:
        end = start + span
    except OverflowError:
        end = datetime.max.replace(tzinfo=UTC)
    filters = EventFilters(start=start, end=end, gpu=gpu_text, kind=kind)
    try:
        found, total = on_async(ten_minutes, lambda c: history.events(c, filters, limit=3, after=after))
    except DataRefusedError:  # PostgreSQL text holds no NUL
        assert "\x00" in (gpu_text or "") + (kind or "") + ("".join(after[1:]) if after else "")
        return
    assert total <= 6
    assert len(found) <= 3
    for e in found:
        assert start <= e["time"] < end
        assert gpu_text is None or e["gpu_uuid"] == gpu_text
        assert kind is None or e["kind"] == kind
        assert after is None or (e["time"], e["gpu_uuid"], e["kind"]) < after

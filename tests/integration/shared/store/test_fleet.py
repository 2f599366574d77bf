"""shared.store.fleet against a migrated schema: the summary, the GPU list, one GPU, the newest sample."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fleets
from services.api.answers.gpus import GpuListed
from shared.plumbing.db import connect
from shared.plumbing.errors import DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store import fleet
from shared.store.fleet import SORTS, GpuFilters
from tests.helpers.store_rows import T0, add_alert, add_gpu, add_latest, add_status, gpu, on_async


@pytest.fixture
def fleet_of_four(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> DatabaseSettings:
    """GPU 0 reporting now; GPU 1 61 s behind; GPU 2 5 min behind; GPU 3 never reported."""
    for i, host in enumerate(["node-a", "node-a", "node-b", "node-c"]):
        add_gpu(conn, i, host=host, rack=f"rack-{i % 2}")
    add_latest(conn, 0, at=T0, temp_c=70)
    add_latest(conn, 1, at=T0 - timedelta(seconds=61), temp_c=50)
    add_latest(conn, 2, at=T0 - timedelta(minutes=5), temp_c=60)
    add_status(conn, 0, state="healthy", score=100)
    add_status(conn, 1, state="degraded", score=80)
    add_status(conn, 2, state="unhealthy", score=10)
    add_alert(conn, 2, kind="unhealthy_memory", severity="critical")
    add_alert(conn, 1, kind="thermal", severity="warning", state="acknowledged")
    add_alert(conn, 0, kind="power_limit", severity="warning", state="resolved")
    conn.commit()
    return migrated


def test_the_summary_counts_a_gpu_missing_by_the_threshold_it_is_given(
    fleet_of_four: DatabaseSettings,
) -> None:
    by_rule = on_async(fleet_of_four, lambda c: fleet.summary(c, missing_after_s=60))
    assert by_rule.totals["missing"] == 3  # 61 s and 5 min behind the newest, and never seen
    assert on_async(fleet_of_four, lambda c: fleet.summary(c, missing_after_s=120)).totals["missing"] == 2
    assert (by_rule.totals["gpus"], by_rule.totals["healthy"], by_rule.totals["degraded"]) == (4, 1, 1)
    assert (by_rule.totals["unhealthy"], by_rule.totals["not_scored"], by_rule.totals["max_temp_c"]) == (
        1,
        1,
        70,
    )
    assert by_rule.open_alerts == {"critical": 1, "warning": 1}  # acknowledged is unresolved; resolved is not
    assert [(p["rack"], p["gpus"]) for p in by_rule.by_location] == [("rack-0", 2), ("rack-1", 2)]


def test_the_sync_callers_run_the_same_statements(fleet_of_four: DatabaseSettings) -> None:
    with connect(fleet_of_four) as c:
        assert fleet.summary_sync(c, missing_after_s=60) == on_async(
            fleet_of_four, lambda a: fleet.summary(a, missing_after_s=60)
        )
        for sort in SORTS:
            assert fleet.gpu_page_sync(c, GpuFilters(), sort=sort, limit=2, offset=1) == on_async(
                fleet_of_four, partial(fleet.gpu_page, filters=GpuFilters(), sort=sort, limit=2, offset=1)
            )


def test_the_gpu_list_filters_sorts_and_pages(fleet_of_four: DatabaseSettings) -> None:
    def listed(filters: GpuFilters, sort: str = "score", limit: int = 10, offset: int = 0) -> fleet.GpuPage:
        return on_async(
            fleet_of_four, lambda c: fleet.gpu_page(c, filters, sort=sort, limit=limit, offset=offset)
        )

    everything = listed(GpuFilters())
    assert everything.total == 4
    assert [g["gpu_uuid"] for g in everything.gpus] == [gpu(2), gpu(1), gpu(0), gpu(3)]  # unscored last
    assert [g["gpu_uuid"] for g in listed(GpuFilters(), "-temp").gpus] == [gpu(0), gpu(2), gpu(1), gpu(3)]
    on_a = listed(GpuFilters(host="node-a"), "hostname")
    assert (on_a.total, [g["gpu_index"] for g in on_a.gpus]) == (2, [0, 1])
    assert listed(GpuFilters(state="degraded")).gpus[0]["gpu_uuid"] == gpu(1)
    second = listed(GpuFilters(), "hostname", limit=1, offset=1)
    assert (second.total, [g["gpu_uuid"] for g in second.gpus]) == (4, [gpu(1)])
    assert list(everything.gpus[0]) == list(GpuListed.model_fields)  # keys in the order the API answers


def test_one_gpus_detail(fleet_of_four: DatabaseSettings) -> None:
    detail = on_async(fleet_of_four, lambda c: fleet.gpu_detail(c, gpu(2)))
    assert detail is not None
    assert (detail.asset["hostname"], detail.status and detail.status["state"]) == ("node-b", "unhealthy")
    assert [a["kind"] for a in detail.open_alerts] == ["unhealthy_memory"]
    assert (detail.verdicts, detail.prediction) == ([], None)
    never = on_async(fleet_of_four, lambda c: fleet.gpu_detail(c, gpu(3)))
    assert never is not None
    assert (never.latest, never.status) == (None, None)
    assert on_async(fleet_of_four, lambda c: fleet.gpu_detail(c, gpu(9))) is None


def test_the_newest_sample_hostnames_and_placement(
    migrated: DatabaseSettings, conn: psycopg.Connection[Any]
) -> None:
    assert fleet.newest_sample_time(conn) is None
    add_gpu(conn, 0, host="node-a", rack="r1")
    add_latest(conn, 0, at=T0)
    conn.commit()
    assert fleet.newest_sample_time(conn) == T0
    assert fleet.hostnames(conn, [gpu(0), gpu(1)]) == {gpu(0): "node-a"}
    assert on_async(migrated, lambda c: fleet.placement(c, gpu(0))) == {
        "hostname": "node-a",
        "gpu_index": 0,
        "rack": "r1",
    }
    assert on_async(migrated, lambda c: fleet.placement(c, gpu(1))) is None


filter_text = st.text(max_size=40) | st.sampled_from(["node-a", "' OR 1=1 --", "%", "_", "\\", "rack-0"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    host=st.none() | filter_text,
    rack=st.none() | filter_text,
    model=st.none() | filter_text,
    state=st.none() | filter_text,
    sort=st.sampled_from(sorted(SORTS)),
    limit=st.integers(0, 2000),
    offset=st.integers(0, 2**31),
)
def test_hostile_filters_are_values_never_sql(
    fleet_of_four: DatabaseSettings,
    host: str | None,
    rack: str | None,
    model: str | None,
    state: str | None,
    sort: str,
    limit: int,
    offset: int,
) -> None:
    filters = GpuFilters(host=host, rack=rack, model=model, state=state)
    with connect(fleet_of_four) as c:
        try:
            found = fleet.gpu_page_sync(c, filters, sort=sort, limit=limit, offset=offset)
        except DataRefusedError:
            assert any(
                "\x00" in (v or "") for v in (host, rack, model, state)
            )  # PostgreSQL text holds no NUL
            return
    assert found.total <= 4
    assert len(found.gpus) <= min(limit, 4)
    for g in found.gpus:
        assert host is None or g["hostname"] == host
        assert rack is None or g["rack"] == rack
        assert state is None or g["state"] == state


def test_the_benches_synthetic_fleets(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> None:
    fleets.fill_api_bench_fleet(conn, as_of=T0, gpus=16, rollup_minutes=5)
    totals = fleet.summary_sync(conn, missing_after_s=60).totals
    assert (totals["gpus"], totals["healthy"], totals["degraded"], totals["missing"]) == (16, 14, 2, 0)
    assert conn.execute("SELECT count(*) FROM gpu_metrics_1min").fetchone() == (16 * 5,)


def test_the_scorer_benchs_synthetic_fleet(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> None:
    fleets.fill_scorer_bench_fleet(conn, as_of=T0, gpus=16)
    assert fleet.newest_sample_time(conn) == T0
    assert conn.execute("SELECT count(*), count(DISTINCT gpu_uuid) FROM gpu_metrics_1min").fetchone() == (
        960,
        16,
    )

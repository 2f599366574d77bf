"""Every Grafana panel's SQL, with Grafana's macros expanded, runs on a pipeline-filled database
as the read-only role Grafana uses, and the time-series panels return data."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from services.api.app import reader_settings
from services.api.settings import ApiSection
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.usage import UsageQuery, usage_sync
from tests.helpers.usage_fleet import T0, hand_fleet, store
from tests.paths import REPO

DEPLOY = REPO / "deploy" / "grafana"
DASHBOARDS = sorted((DEPLOY / "dashboards").glob("*.json"))


def expand(query: str, start: datetime, end: datetime, gpu: str) -> str:
    """Grafana's PostgreSQL macros and this project's template variable, as Grafana expands them."""
    query = re.sub(
        r"\$__timeFilter\((\w+)\)", rf"\1 BETWEEN '{start.isoformat()}' AND '{end.isoformat()}'", query
    )
    query = query.replace("$__timeFrom()", f"'{start.isoformat()}'").replace(
        "$__timeTo()", f"'{end.isoformat()}'"
    )
    query = re.sub(
        r"\$__timeGroupAlias\((\w+),\s*'([^']+)'\)",
        # Grafana writes time_bucket unqualified and reads `public`; the test's session is bound to its schema
        lambda m: f"public.time_bucket('{m[2]}', {m[1]}) AS \"time\"",
        query,
    )
    return query.replace("$gpu", gpu)


def panels() -> list[tuple[str, dict[str, Any]]]:
    return [(d.stem, p) for d in DASHBOARDS for p in json.loads(d.read_text())["panels"]]


def test_dashboards_are_provisioned_from_the_datasource_they_use() -> None:
    assert {d.stem for d in DASHBOARDS} == {"fleet-overview", "gpu-detail", "predictions"}
    sources = yaml.safe_load((DEPLOY / "provisioning" / "datasources" / "timescaledb.yaml").read_text())
    tsdb = next(s for s in sources["datasources"] if s["type"] == "grafana-postgresql-datasource")
    assert tsdb["user"] == "gpuhealth_reader"
    for name, panel in panels():
        assert panel["datasource"]["uid"] == tsdb["uid"], (name, panel["title"])
    for d in DASHBOARDS:
        ids = [p["id"] for p in json.loads(d.read_text())["panels"]]
        assert len(ids) == len(set(ids)), d.name


def test_every_panel_query_runs_and_time_series_have_data(
    migrated: DatabaseSettings, scored: dict[str, Any]
) -> None:
    end = datetime.now(UTC)
    start = end - timedelta(hours=6)
    reader = reader_settings(migrated, ApiSection())
    empty = []
    with connect(reader) as conn:
        for d in DASHBOARDS:
            for variable in json.loads(d.read_text())["templating"]["list"]:
                assert scored["sick"] in {str(r[0]) for r in conn.execute(variable["query"]).fetchall()}
        for name, panel in panels():
            for target in panel["targets"]:
                cur = conn.execute(expand(target["rawSql"], start, end, scored["sick"]))
                rows = cur.fetchall()
                if target["format"] == "time_series":  # Grafana needs the time column first
                    assert cur.description is not None
                    assert cur.description[0].name == "time", (name, panel["title"])
                if not rows:
                    empty.append(f"{name}: {panel['title']}")
    # Only the 'GPUs above 20 %' series may be empty: nothing in this small fleet is that risky.
    assert empty == [] or empty == ["predictions: GPUs above 20% (30 days) over time"], empty


def test_the_usage_panels_give_the_apis_numbers(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        store(conn, hand_fleet())
    start, end = T0, T0 + timedelta(hours=2)
    by_title = {p["title"]: p for _, p in panels()}
    reader = reader_settings(migrated, ApiSection())
    with connect(reader) as conn:
        table = by_title["Usage by workload class (the dashboard's range)"]["targets"][0]["rawSql"]
        cur = conn.execute(expand(table, start, end, ""))
        columns = [c.name for c in cur.description or ()]
        rows = {r[0]: dict(zip(columns, r, strict=True)) for r in cur.fetchall()}
        api = usage_sync(conn, UsageQuery(start=start, end=end, by="class"))
        assert set(rows) == {g["key"] for g in api.groups} == {"training", "inference", "none"}
        for g in api.groups:
            got = rows[g["key"]]
            assert got["gpu_hours"] == pytest.approx(g["gpu_hours"], rel=1e-12)
            assert got["busy_pct"] == pytest.approx(100 * g["busy_share"], rel=1e-12)
            assert got["idle_allocated_pct"] == pytest.approx(100 * g["idle_allocated_share"], rel=1e-12)
            assert got["energy_kwh"] == pytest.approx(g["energy_kwh"], rel=1e-12)
        hourly = by_title["GPU-hours by namespace (usage, per hour)"]["targets"][0]["rawSql"]
        series = conn.execute(expand(hourly, start, end, "")).fetchall()
        hours = sum(float(str(v)) for _, _, v in series)
        assert hours == pytest.approx(api.totals[0]["gpu_hours"], rel=1e-12)
        assert {m for _, m, _ in series} == {"ml", "web", "(no namespace)"}

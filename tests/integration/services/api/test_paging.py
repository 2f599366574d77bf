"""API boundaries: keyset cursors with totals on every list, a series that fits its bucket, one time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.api.settings import ApiSection
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role

T0 = datetime(2026, 4, 1, tzinfo=UTC)
HOSTS = 5
Z_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
ANY_TIME = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d")
suppress = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def uuid(n: int) -> str:
    return f"GPU-{n:08d}-0000-0000-0000-000000000000"


@pytest.fixture
def fleet(migrated: DatabaseSettings) -> DatabaseSettings:
    """20 GPUs on 5 hosts; 60 events (ties in time included), 45 alerts, 20 predictions (ties in p)."""
    with connect(migrated) as conn:
        for n in range(20):
            conn.execute(
                "INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, rack, first_seen, last_seen)"
                " VALUES (%s, 'H100', %s, %s, 'r1', %s, %s)",
                (uuid(n), n % 4, f"node-{n % HOSTS}", T0, T0))  # fmt: skip
            conn.execute(
                "INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c)"
                " VALUES (%s, %s, %s, 'dcgm', 'c', 40)", (T0, uuid(n), f"node-{n % HOSTS}"))  # fmt: skip
            conn.execute(
                "INSERT INTO gpu_failure_predictions (time, gpu_uuid, p_fail_7d, p_fail_30d)"
                " VALUES (%s, %s, 0.01, %s)", (T0, uuid(n), round((n % 7) / 10, 1)))  # fmt: skip
        for n in range(60):
            conn.execute(
                "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
                " VALUES (%s, %s, 'xid', 'h', 'dcgm', 'c', '{}')",
                (T0 - timedelta(minutes=n // 3), uuid(n % 20)))  # fmt: skip
        for n in range(45):
            conn.execute(
                "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at)"
                " VALUES (%s, %s, %s, 'open', 's', %s, %s)",
                (uuid(n % 20), f"k{n}", ("critical", "warning", "info")[n % 3],
                 T0 - timedelta(minutes=n // 4), T0))  # fmt: skip
        conn.commit()
    return migrated


@pytest.fixture
def client(fleet: DatabaseSettings) -> Iterator[TestClient]:
    with TestClient(headers=as_role("viewer"), app=api_app(fleet)) as c:
        yield c


def walk(
    client: TestClient, path: str, name: str, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    cursor = None
    totals = set()
    for _ in range(200):
        reply = client.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert set(body) >= {name, "total", "limit", "next_cursor"}
        assert len(body[name]) <= params["limit"]
        totals.add(body["total"])
        items += body[name]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(totals) == 1
    return items, totals.pop()


@given(limit=st.integers(1, 50))
@suppress
def test_cursors_walk_every_list_exactly_once_in_order_with_the_total(client: TestClient, limit: int) -> None:
    events, total = walk(client, "/api/v1/events", "events", {"limit": limit, "from": "2026-03-31T00:00:00Z",
                                                              "to": "2026-04-02T00:00:00Z"})  # fmt: skip
    assert total == len(events) == 60
    keys = [(e["time"], e["gpu_uuid"], e["kind"]) for e in events]
    assert keys == sorted(keys, reverse=True)
    assert len(set(keys)) == 60
    alerts, total = walk(client, "/api/v1/alerts", "alerts", {"limit": limit})
    assert total == len(alerts) == 45
    assert len({a["id"] for a in alerts}) == 45
    ranks = [("critical", "warning", "info").index(a["severity"]) for a in alerts]
    assert ranks == sorted(ranks)
    assert all(a["hostname"].startswith("node-") for a in alerts)
    preds, total = walk(client, "/api/v1/predictions", "predictions", {"limit": limit})
    assert total == len(preds) == 20
    assert [(-p["p_fail_30d"], p["gpu_uuid"]) for p in preds] == sorted(
        (-p["p_fail_30d"], p["gpu_uuid"]) for p in preds
    )
    gpus, total = walk(client, "/api/v1/gpus", "gpus", {"limit": limit, "sort": "hostname"})
    assert total == len(gpus) == 20
    assert len({g["gpu_uuid"] for g in gpus}) == 20


def test_filters_keep_the_total_of_what_they_match(client: TestClient) -> None:
    body = client.get("/api/v1/alerts", params={"severity": "critical", "limit": 2}).json()
    assert (body["total"], len(body["alerts"])) == (15, 2)
    assert body["next_cursor"]
    body = client.get("/api/v1/alerts", params={"host": "node-1", "limit": 1000}).json()
    assert body["total"] == 9
    assert {a["hostname"] for a in body["alerts"]} == {"node-1"}
    body = client.get("/api/v1/predictions", params={"min_p30": 0.6}).json()
    assert body["total"] == len(body["predictions"]) == 2


@given(cursor=st.text(max_size=80) | st.from_regex(r"\A[A-Za-z0-9_-]{1,80}\Z"))
@suppress
def test_a_cursor_not_returned_by_the_api_is_a_4xx_naming_it(client: TestClient, cursor: str) -> None:
    for path in ("/api/v1/events", "/api/v1/alerts", "/api/v1/predictions", "/api/v1/gpus"):
        reply = client.get(path, params={"cursor": cursor})
        assert reply.status_code in (200, 400, 422), (path, cursor, reply.text)
        if reply.status_code == 400:
            assert "cursor" in reply.json()["detail"]


def test_a_cursor_from_another_list_is_refused(client: TestClient) -> None:
    window: dict[str, Any] = {"limit": 1, "from": "2026-03-31T00:00:00Z", "to": "2026-04-02T00:00:00Z"}
    cursor = client.get("/api/v1/events", params=window).json()["next_cursor"]
    assert cursor
    for path in ("/api/v1/alerts", "/api/v1/predictions", "/api/v1/gpus"):
        assert client.get(path, params={"cursor": cursor}).status_code == 400


@pytest.mark.parametrize(
    ("params", "bucket"),
    [
        ({"bucket": "10s"}, "1m"),
        ({"bucket": "10s", "from": "2026-03-02T00:00:00Z", "to": "2026-04-01T00:00:00Z"}, "15m"),
        ({"bucket": "1h"}, "1h"),
        ({}, "1m"),
    ],
)
def test_a_series_too_fine_for_its_range_gets_the_finest_bucket_that_fits(
    client: TestClient, params: dict[str, str], bucket: str
) -> None:
    reply = client.get(f"/api/v1/gpus/{uuid(1)}/series", params=params)
    assert reply.status_code == 200, reply.text
    assert reply.json()["bucket"] == bucket
    assert reply.json()["requested_bucket"] == params.get("bucket", "1m")


def test_when_even_a_day_is_too_fine_the_range_keeps_its_newest_end(fleet: DatabaseSettings) -> None:
    with TestClient(headers=as_role("viewer"), app=api_app(fleet, ApiSection(max_points=10))) as c:
        month = {"from": "2026-03-01T00:00:00Z", "to": "2026-04-01T00:00:00Z"}
        body = c.get(f"/api/v1/gpus/{uuid(1)}/series", params=month).json()
    assert body["bucket"] == "1d"
    assert (body["from"], body["to"]) == ("2026-03-22T00:00:00.000000Z", "2026-04-01T00:00:00.000000Z")


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, key)
    elif isinstance(value, str):
        yield key, value


def test_every_time_is_utc_with_a_z_and_empty_collections_are_lists(client: TestClient) -> None:
    paths = [
        "/api/v1/fleet/summary",
        "/api/v1/gpus",
        f"/api/v1/gpus/{uuid(3)}",
        f"/api/v1/gpus/{uuid(3)}/series",
        "/api/v1/events?from=2026-03-31T00:00:00Z&to=2026-04-02T00:00:00Z",
        "/api/v1/alerts",
        "/api/v1/predictions",
    ]
    seen = 0
    for path in paths:
        body = client.get(path).json()
        for key, text in _strings(body):
            if ANY_TIME.match(text):
                seen += 1
                assert Z_TIME.match(text), (path, key, text)
    assert seen > 100
    detail = client.get(f"/api/v1/gpus/{uuid(3)}").json()
    assert detail["latest"]["mig"] == []
    assert detail["verdicts"] == []
    assert all(a["hostname"] == "node-3" for a in detail["open_alerts"])
    assert detail["open_alerts"]
    summary = client.get("/api/v1/fleet/summary").json()
    assert summary["open_alerts"] == {"critical": 15, "warning": 15, "info": 15}
    none = client.get("/api/v1/events", params={"from": "2000-01-01T00:00:00Z", "to": "2000-01-02T00:00:00Z"})
    assert none.json() == {"events": [], "total": 0, "limit": 100, "next_cursor": None}
    series = client.get(f"/api/v1/gpus/{uuid(3)}/series").json()
    assert series["points"] == []


def test_acknowledging_answers_with_the_host(client: TestClient) -> None:
    alert = client.get("/api/v1/alerts", params={"host": "node-2", "limit": 1}).json()["alerts"][0]
    done = client.post(f"/api/v1/alerts/{alert['id']}/acknowledge", headers=as_role("operator"))
    assert done.status_code == 200, done.text
    assert done.json()["hostname"] == "node-2"
    assert Z_TIME.match(done.json()["acknowledged_at"])


@pytest.fixture
def verified(fleet: DatabaseSettings) -> DatabaseSettings:
    """7 nodes' identities (node-0 announced 9 times) and 23 verification records of one GPU."""
    with connect(fleet) as conn:
        for n in range(7):
            for k in range(9 if n == 0 else 1):
                record = '{"gpus": [{"model": "H100"}]}' if n % 2 else '{"gpus": "hostile"}'
                conn.execute(
                    "INSERT INTO gpu_systems (time, hostname, identity_sha256, source, gpus, record)"
                    " VALUES (%s, %s, %s, 'nvml', 1, %s)",
                    (T0 - timedelta(hours=k // 2), f"node-{n}", f"{k:064x}", record))  # fmt: skip
            conn.execute(
                "INSERT INTO gpu_systems_latest (time, hostname, identity_sha256, source, gpus, record)"
                " VALUES (%s, %s, 'x', 'nvml', 1, %s)", (T0, f"node-{n}", record))  # fmt: skip
        for seq in range(23):
            conn.execute(
                "INSERT INTO gpu_verifications (time, gpu_uuid, seq, kind, name, outcome, hostname, device,"
                " prev_sha256, sha256, record, source_partition, source_offset)"
                " VALUES (%s, %s, %s, 'compute_check', 'matmul', 'pass', 'node-1', 'cuda:0',"
                " %s, %s, '{}', 0, %s)",
                (T0 + timedelta(seconds=seq), uuid(1), seq, f"{seq:064x}", f"{seq + 1:064x}",
                 seq))  # fmt: skip
        conn.commit()
    return fleet


@pytest.mark.parametrize("limit", [1, 2, 5, 100])
def test_the_verifier_lists_page_with_cursors_and_totals_too(verified: DatabaseSettings, limit: int) -> None:
    with TestClient(headers=as_role("viewer"), app=api_app(verified, ApiSection())) as c:
        systems, total = walk(c, "/api/v1/systems", "systems", {"limit": limit})
        assert total == len(systems) == 7
        assert [s["hostname"] for s in systems] == [f"node-{n}" for n in range(7)]
        assert all(
            isinstance(s["gpu_models"], list) for s in systems
        )  # never null, even for a hostile record
        history, total = walk(c, "/api/v1/systems/node-0/history", "history", {"limit": limit})
        assert total == len(history) == 9
        assert len({h["identity_sha256"] for h in history}) == 9
        records, total = walk(c, f"/api/v1/gpus/{uuid(1)}/verifications", "verifications", {"limit": limit})
        assert total == len(records) == 23
        assert [r["seq"] for r in records] == list(range(22, -1, -1))

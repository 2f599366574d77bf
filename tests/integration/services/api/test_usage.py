"""/api/v1/usage, its timeline and its CSV and Parquet export, against a fleet worked out by hand.

The fleet is tests/helpers/usage_fleet.py's hand_fleet (its docstring works out each figure).
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import workload
from tests.helpers.identities import VIEWER, as_role
from tests.helpers.usage_fleet import T0, hand_fleet, store, uuid_of

HOUR = 3600.0
WINDOW = {"from": T0.isoformat(), "to": (T0 + timedelta(hours=2)).isoformat()}
FIGURES = ("gpus", "gpu_hours", "busy_hours", "busy_share", "idle_allocated_hours", "idle_allocated_share",
           "avg_util_pct", "energy_kwh")  # fmt: skip
BY_NAMESPACE = {
    "ml": {"gpus": 1, "gpu_hours": 1.0, "busy_hours": 1.0, "busy_share": 1.0, "idle_allocated_hours": 0.0,
           "idle_allocated_share": 0.0, "avg_util_pct": 50.0, "energy_kwh": 3590 * 300 / 3.6e6},
    "web": {"gpus": 1, "gpu_hours": 0.5, "busy_hours": 0.0, "busy_share": 0.0, "idle_allocated_hours": 0.5,
            "idle_allocated_share": 1.0, "avg_util_pct": 0.0, "energy_kwh": 1790 * 100 / 3.6e6},
    None: {"gpus": 1, "gpu_hours": 0.5, "busy_hours": 0.5, "busy_share": 1.0, "idle_allocated_hours": 0.0,
           "idle_allocated_share": 0.0, "avg_util_pct": 50.0, "energy_kwh": 1790 * 200 / 3.6e6},
}  # fmt: skip
TOTAL = {"gpus": 2, "gpu_hours": 2.0, "busy_hours": 1.5, "busy_share": 0.75, "idle_allocated_hours": 0.5,
         "idle_allocated_share": 0.25, "avg_util_pct": 37.5,
         "energy_kwh": (3590 * 300 + 1790 * 100 + 1790 * 200) / 3.6e6}  # fmt: skip


@pytest.fixture
def api(served_api: str, migrated: DatabaseSettings) -> Iterator[httpx.Client]:
    with connect(migrated) as conn:
        store(conn, hand_fleet())
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=30) as client:
        yield client


def close(got: dict[str, Any], want: dict[str, Any]) -> None:
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-9), name


def test_usage_by_namespace_is_the_hand_worked_figures_with_their_total(api: httpx.Client) -> None:
    body = api.get("/api/v1/usage", params={**WINDOW, "by": "namespace"}).json()
    assert body["from"] == "2026-05-04T00:00:00.000000Z"
    assert body["groups"][0]["key"] == "ml"  # the most GPU-hours first
    assert {g["key"] for g in body["groups"]} == set(BY_NAMESPACE)
    for g in body["groups"]:
        close(g, BY_NAMESPACE[g["key"]])
    close(body["total"], TOTAL)


def test_filters_and_other_dimensions(api: httpx.Client) -> None:
    by_class = api.get("/api/v1/usage", params={**WINDOW, "by": "class"}).json()
    assert {g["key"]: g["gpu_hours"] for g in by_class["groups"]} == pytest.approx(
        {"training": 1.0, "inference": 0.5, "none": 0.5}
    )
    bob = api.get("/api/v1/usage", params={**WINDOW, "by": "hostname", "user": "bob"}).json()
    assert [(g["key"], g["gpu_hours"], g["idle_allocated_hours"]) for g in bob["groups"]] == [
        ("n1", 0.5, 0.5)
    ]
    close(bob["total"], {"gpus": 1, "gpu_hours": 0.5, "idle_allocated_share": 1.0})
    nobody = api.get("/api/v1/usage", params={**WINDOW, "namespace": "no-such"}).json()
    assert nobody["groups"] == []
    assert nobody["total"]["gpu_hours"] == 0.0
    assert nobody["total"]["energy_kwh"] is None


def test_the_timeline_gives_each_period_its_groups_and_total(api: httpx.Client) -> None:
    body = api.get("/api/v1/usage/timeline", params={**WINDOW, "by": "namespace", "step": "1h"}).json()
    assert [p["period"] for p in body["periods"]] == [
        "2026-05-04T00:00:00.000000Z",
        "2026-05-04T01:00:00.000000Z",
    ]
    first, second = body["periods"]
    close(first["total"], {"gpus": 2, "gpu_hours": 1.5, "idle_allocated_hours": 0.5})
    assert [g["key"] for g in first["groups"]] == ["ml", "web"]
    close(second["total"], {"gpus": 1, "gpu_hours": 0.5, "busy_hours": 0.5})


@pytest.mark.parametrize("step", [None, "1h"])
def test_the_csv_and_parquet_exports_hold_the_apis_numbers(api: httpx.Client, step: str | None) -> None:
    extra = {"step": step} if step else {}
    answer = api.get("/api/v1/usage" + ("/timeline" if step else ""), params={**WINDOW, **extra}).json()
    periods = answer["periods"] if step else [{"period": None, **answer}]
    want = []
    for p in periods:
        want += [{"period": p["period"], "kind": "group", **g} for g in p["groups"]]
        want.append({"period": p["period"], "kind": "total", "key": None, **p["total"]})

    as_csv = api.get("/api/v1/usage/export", params={**WINDOW, **extra, "format": "csv"})
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert (
        'filename="gpu-usage-by-namespace-20260504T0000-20260504T0200.csv"'
        in as_csv.headers["content-disposition"]
    )
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [(r["period"] or None, r["kind"], r["key"] or None) for r in rows] == [
        (w["period"] and w["period"].replace(".000000Z", "Z"), w["kind"], w["key"]) for w in want
    ]
    for r, w in zip(rows, want, strict=True):
        assert r["from"] == "2026-05-04T00:00:00Z"
        for name in FIGURES:
            assert (float(r[name]) if r[name] else None) == w[name], name  # the same numbers, exactly

    as_parquet = api.get("/api/v1/usage/export", params={**WINDOW, **extra, "format": "parquet"})
    assert as_parquet.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(as_parquet.content))
    assert str(table.schema.field("gpu_hours").type) == "double"
    assert str(table.schema.field("from").type) == "timestamp[us, tz=UTC]"
    for r, w in zip(table.to_pylist(), want, strict=True):
        assert (r["kind"], r["key"]) == (w["kind"], w["key"])
        assert {name: r[name] for name in FIGURES} == {name: w[name] for name in FIGURES}


@pytest.mark.parametrize(
    ("params", "status", "said"),
    [
        ({"by": "colour"}, 422, "by"),
        ({"team": "x"}, 422, "unknown query parameters ['team']"),
        ({"class": "mining"}, 422, "class"),
        ({"from": "2026-05-04T00:00:10Z", "to": "2026-05-04T00:00:50Z"}, 400, "no whole minute"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-05-01T00:00:00Z"}, 400, "at most 31 days"),
        ({"format": "xlsx"}, 422, "format"),
    ],
)
def test_a_question_it_cannot_answer_is_refused_saying_why(
    served_api: str, params: dict[str, str], status: int, said: str
) -> None:
    path = "/api/v1/usage/export" if "format" in params else "/api/v1/usage"
    response = VIEWER.get(served_api + path, params=params, timeout=30)
    assert response.status_code == status
    assert said in response.json()["detail"]


def test_what_was_on_a_gpu_when_it_failed_is_one_answer(
    api: httpx.Client, migrated: DatabaseSettings
) -> None:
    gpu, other = uuid_of(1), uuid_of(2)
    with connect(migrated) as conn:
        for uuid, t, subsystem, state in [
            (gpu, T0 - timedelta(days=1), "xid", "healthy"),  # in force when the range begins
            (gpu, T0 + timedelta(minutes=41), "xid", "unhealthy"),
            (gpu, T0 + timedelta(minutes=90), "xid", "healthy"),  # after it
            (other, T0 + timedelta(minutes=41), "xid", "unhealthy"),
        ]:
            conn.execute(
                "INSERT INTO gpu_health (time, gpu_uuid, subsystem, state, rule)"
                " VALUES (%s, %s, %s, %s, 'r')",
                (t, uuid, subsystem, state),
            )
        for uuid, opened, resolved, kind in [
            (gpu, T0 + timedelta(minutes=41), T0 + timedelta(minutes=70), "xid"),
            (gpu, T0 - timedelta(hours=3), T0 - timedelta(hours=2), "thermal"),  # over before the range
            (other, T0 + timedelta(minutes=41), None, "xid"),
        ]:
            conn.execute(
                "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at,"
                " resolved_at) VALUES (%s, %s, 'critical', %s, 'XID 79', %s, %s, %s)",
                (uuid, kind, "resolved" if resolved else "open", opened, opened, resolved),
            )
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, 'xid', 'n1', 'mock', 'sim', '{\"xid\": 79}')",
            (T0 + timedelta(minutes=40, seconds=30), gpu),
        )
        conn.commit()
    window = {
        "from": (T0 + timedelta(minutes=30)).isoformat(),
        "to": (T0 + timedelta(minutes=50)).isoformat(),
    }
    body = api.get(f"/api/v1/gpus/{gpu}/timeline", params=window).json()
    assert [(j["job"], j["pod"], j["namespace"], j["hostname"], j["minutes"]) for j in body["jobs"]] == [
        ("train", "train-0", "ml", "n1", 20)
    ]
    assert body["jobs"][0]["busy_share"] == 1.0
    assert [(c["classification"], c["user"], c["minutes"]) for c in body["classes"]] == [
        ("training", "alice", 20)
    ]
    (proc,) = body["processes"]
    assert (proc["pid"], proc["classification"], proc["user"], proc["polls"]) == (
        100,
        "training",
        "alice",
        120,
    )
    assert proc["first_seen"] == "2026-05-04T00:30:00.000000Z"
    assert [(v["state"], v["before"]) for v in body["verdicts"]] == [("healthy", True), ("unhealthy", False)]
    assert [(a["kind"], a["state"]) for a in body["alerts"]] == [("xid", "resolved")]
    assert [(e["kind"], e["details"]) for e in body["events"]] == [("xid", {"xid": 79})]
    assert body["truncated"] == []
    cut = api.get(f"/api/v1/gpus/{gpu}/timeline", params={**window, "limit": 1}).json()
    assert cut["truncated"] == ["verdicts"]
    assert len(cut["verdicts"]) == 1
    nothing = api.get(f"/api/v1/gpus/{uuid_of(9)}/timeline", params=window).json()
    assert all(nothing[k] == [] for k in ("jobs", "classes", "processes", "verdicts", "alerts", "events"))


def session(t: timedelta, i: int, *, model: str, server: str, ok: bool = True) -> tuple[Any, ...]:
    """One request, in workload.SESSION_COLUMNS' order: TTFT, TPOT and tokens/s all `i`."""
    request_id = hashlib.md5(f"{server}/{model}/{i}".encode()).hexdigest()  # an id, not a secret
    figures = (10, 20, None, None, None, None, float(i), float(i), float(i), float(i))
    failed = (500, False, "boom") if not ok else (200, True, None)
    return (
        T0 + t,
        request_id,
        "proxy",
        "m1",
        server,
        "ollama",
        "/api/generate",
        model,
        True,
        *failed,
        *figures,
    )


def test_llm_serving_per_model_server_and_hour(served_api: str, migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn, conn.cursor() as cur:
        for i in range(1, 101):  # llama3 on s1 in the first hour: 100 requests, the last 3 failed
            workload.insert_session(cur, session(timedelta(seconds=30 * i), i, model="llama3", server="s1",
                                                 ok=i <= 97))  # fmt: skip
        for i in range(1, 11):
            workload.insert_session(cur, session(timedelta(hours=1, seconds=i), i, model="qwen", server="s2"))
        workload.insert_session(cur, session(timedelta(hours=5), 1, model="qwen", server="s2"))  # outside
        conn.commit()
    window = {"from": T0.isoformat(), "to": (T0 + timedelta(hours=2)).isoformat()}
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=30) as api:
        body = api.get("/api/v1/llm/timeline", params={**window, "step": "1h"}).json()
        first, second = body["periods"]
        assert (first["period"], first["model"], first["server"]) == (
            "2026-05-04T00:00:00.000000Z",
            "llama3",
            "s1",
        )
        assert (first["requests"], first["errors"], first["prompt_tokens"], first["completion_tokens"]) == (
            100, 3, 1000, 2000,
        )  # fmt: skip
        # percentile_cont over 1..100: p50 50.5, p95 95.05, p99 99.01, p5 5.95
        close(first, {"ttft_p50_ms": 50.5, "ttft_p95_ms": 95.05, "ttft_p99_ms": 99.01, "tpot_p95_ms": 95.05,
                      "tps_p50": 50.5, "tps_p5": 5.95})  # fmt: skip
        assert (second["period"], second["model"], second["requests"]) == (
            "2026-05-04T01:00:00.000000Z",
            "qwen",
            10,
        )
        by_day = api.get("/api/v1/llm/timeline", params={**window, "step": "1d", "model": "qwen"}).json()
        assert [(p["period"], p["requests"]) for p in by_day["periods"]] == [
            ("2026-05-04T00:00:00.000000Z", 10)
        ]
        refused = api.get("/api/v1/llm/timeline", params={**window, "step": "5m"})
        assert refused.status_code == 422

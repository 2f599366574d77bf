"""The query API against a database filled by the real pipeline and scored by the real scorer."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from services.api import cli
from services.api.app import reader_settings
from services.api.settings import ApiSection
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role, token_args


@pytest.fixture
def client(migrated: DatabaseSettings) -> Iterator[TestClient]:
    app = api_app(migrated)
    with TestClient(app, headers=as_role("viewer")) as c:
        yield c


def test_health_readiness_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json() == {"ready": True}
    client.get("/api/v1/fleet/summary")
    assert "gpuhealth_api_requests_total" in client.get("/metrics").text
    assert "/api/v1/gpus/{gpu_uuid}/series" in client.get("/openapi.json").json()["paths"]


def test_fleet_gpus_and_one_gpu_match_what_was_ingested(client: TestClient, scored: dict[str, Any]) -> None:
    summary = client.get("/api/v1/fleet/summary").json()
    assert (summary["gpus"], summary["unhealthy"], summary["healthy"], summary["missing"]) == (4, 1, 3, 0)
    assert summary["open_alerts"] == {"critical": 2, "warning": 0, "info": 0}  # unhealthy memory and XID 48
    assert summary["by_location"] == [
        {
            "cluster": "c1",
            "datacenter": None,
            "rack": None,
            "gpus": 4,
            "healthy": 3,
            "degraded": 0,
            "unhealthy": 1,
        }
    ]
    listed = client.get("/api/v1/gpus", params={"sort": "score"}).json()
    assert listed["total"] == 4
    assert listed["gpus"][0]["gpu_uuid"] == scored["sick"]
    assert listed["gpus"][0]["action"] == "reset_gpu"
    only_bad = client.get("/api/v1/gpus", params={"state": "unhealthy"}).json()
    assert [g["gpu_uuid"] for g in only_bad["gpus"]] == [scored["sick"]]
    page = client.get("/api/v1/gpus", params={"sort": "hostname", "limit": 2, "offset": 2}).json()
    assert [g["gpu_index"] for g in page["gpus"]] == [2, 3]
    detail = client.get(f"/api/v1/gpus/{scored['sick']}").json()
    verdicts = {v["subsystem"]: v for v in detail["verdicts"]}
    assert verdicts["memory"]["state"] == "unhealthy"
    assert verdicts["memory"]["rule"] == "volatile_dbe"
    assert verdicts["memory"]["evidence"]["dbe_volatile"] == 1
    assert detail["latest"]["ecc_dbe_volatile_total"] == 1
    assert detail["asset"]["model"] == "NVIDIA H100 80GB HBM3"
    assert detail["prediction"]["p_fail_30d"] > 0
    assert {a["kind"] for a in detail["open_alerts"]} == {"unhealthy_memory", "unhealthy_xid"}
    day = (datetime.fromisoformat(detail["latest"]["time"]) - timedelta(hours=6)).isoformat()
    series = client.get(f"/api/v1/gpus/{scored['well']}/series", params={"from": day, "bucket": "5m"}).json()
    assert series["points"]
    assert all(p["temp_c"] is not None for p in series["points"])
    old = {"gpu": scored["sick"], "kind": "xid", "from": "2000-01-01T00:00:00Z", "to": "2000-01-20T00:00:00Z"}
    empty = {"events": [], "total": 0, "limit": 100, "next_cursor": None}
    assert client.get("/api/v1/events", params=old).json() == empty
    recent = client.get("/api/v1/events", params={"gpu": scored["sick"], "kind": "xid", "from": day}).json()
    assert [e["details"]["xid"] for e in recent["events"]] == [48]
    ranked = client.get("/api/v1/predictions").json()["predictions"]
    assert ranked[0]["gpu_uuid"] == scored["sick"]


def test_acknowledging_needs_an_operator_and_an_open_alert(
    client: TestClient, scored: dict[str, Any]
) -> None:
    (alert,) = [a for a in client.get("/api/v1/alerts", params={"gpu": scored["sick"]}).json()["alerts"]
                if a["kind"] == "unhealthy_memory"]  # fmt: skip
    url = f"/api/v1/alerts/{alert['id']}/acknowledge"
    assert client.post(url, headers={"Authorization": ""}).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post(url).status_code == 403  # the client's own token: a viewer's
    # the actor is the token's subject: a `by` in the body is ignored
    done = client.post(url, headers=as_role("operator"), json={"by": "oncall@example"})
    assert done.status_code == 200
    assert (done.json()["state"], done.json()["acknowledged_by"]) == ("acknowledged", "local-operator")
    assert client.post(url, headers=as_role("operator")).status_code == 409
    assert client.post("/api/v1/alerts/999999/acknowledge", headers=as_role("admin")).status_code == 404


def test_without_a_configured_issuer_every_caller_is_refused(migrated: DatabaseSettings) -> None:
    from services.api.app import create_app
    from tests.helpers.identities import api_section

    with TestClient(create_app(migrated, api_section()), headers=as_role("admin")) as c:
        refused = c.post("/api/v1/alerts/1/acknowledge")
        assert refused.status_code == 503
        assert "GPUHEALTH_AUTH__JWKS" in refused.json()["detail"]  # says why, and what to do


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("/api/v1/gpus", {"colour": "red"}, 422),
        ("/api/v1/gpus", {"state": "sad"}, 422),
        ("/api/v1/gpus", {"sort": "score; DROP TABLE gpu_metrics"}, 422),
        ("/api/v1/gpus", {"host": "x' OR '1'='1"}, 422),
        ("/api/v1/gpus", {"host": "a" * 300}, 422),
        ("/api/v1/gpus", {"limit": 0}, 422),
        ("/api/v1/gpus", {"limit": 10**9}, 422),
        ("/api/v1/gpus", {"offset": -1}, 422),
        ("/api/v1/gpus/not-a-uuid", {}, 422),
        ("/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000", {}, 404),
        (
            "/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/series",
            {"from": "2026-01-02", "to": "2026-01-01"},
            400,
        ),
        (
            "/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/series",
            {"from": "2020-01-01", "to": "2026-01-01"},
            400,
        ),
        ("/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/series", {"bucket": "3s"}, 422),
        ("/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/series", {"from": "yesterday"}, 422),
        ("/api/v1/events", {"kind": "meteor"}, 422),
        ("/api/v1/events", {"to": "0001-01-01T00:00:00Z"}, 400),  # found by schemathesis: was a 500
        ("/api/v1/events", {"from": "0001-01-01T00:30:00+01:00"}, 400),
        ("/api/v1/alerts", {"state": "'; --"}, 422),
        ("/api/v1/alerts", {"gpu": "\x00"}, 422),
        ("/api/v1/predictions", {"min_p30": 2}, 422),
        ("/api/v1/fleet/summary", {"x": "1"}, 422),
    ],
)
def test_bad_parameters_get_a_4xx_with_a_message(
    client: TestClient, path: str, params: dict[str, Any], status: int
) -> None:
    reply = client.get(path, params=params)
    assert reply.status_code == status, reply.text
    assert reply.json()["detail"]


def test_the_read_only_role_cannot_write(migrated: DatabaseSettings) -> None:
    reader = reader_settings(migrated, ApiSection())
    with connect(reader) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_metrics").fetchone() is not None
        for statement in (
            "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at)"
            " VALUES ('GPU-x', 'k', 'info', 'open', 's', now(), now())",
            "DELETE FROM gpu_metrics",
            "UPDATE gpu_status SET score = 0",
            "DROP TABLE gpu_latest",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()


def test_the_fleet_page_is_served_and_calls_only_real_endpoints(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text + client.get("/static/fleet.js").text
    assert 'data-testid="fleet-grid"' in html
    assert 'data-testid="gpu-detail"' in html
    paths = client.get("/openapi.json").json()["paths"]
    for called in ("/fleet/summary", "/gpus", "/alerts", "/gpus/{gpu_uuid}", "/gpus/{gpu_uuid}/series"):
        assert "/api/v1" + called in paths
        assert called.split("{")[0].rstrip("/") in html


def test_the_cli_prints_the_fleet_and_the_worst_gpus_with_sparklines(
    served_api: str, scored: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*token_args("viewer"), "fleet", "--url", served_api, "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPUs 4  healthy 3  degraded 0  unhealthy 1")
    sick = out[4]
    assert "unhealthy" in sick
    assert "reset_gpu" in sick
    assert any(bar in sick for bar in cli.BARS)
    assert cli.main([*token_args("viewer"), "fleet", "--url", "http://127.0.0.1:9"]) == 1
    assert "open alerts: 2 critical" in out[1]


def test_sparkline() -> None:
    assert cli.sparkline([0, 5, 10]) == "▁▅█"
    assert cli.sparkline([3, 3, None, 3]) == "▁▁ ▁"
    assert cli.sparkline([]) == ""

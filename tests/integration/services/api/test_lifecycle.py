"""/api/v1/lifecycle: the newest run ranked with totals, filters, pages, the CSV, the inventory, history.

The tables hold what the lifecycle service writes (its own functions write them:
two runs of three GPUs, an inventory with a refused row), so every route's
success path runs against real rows.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.api import cli
from services.lifecycle.inventory import parse_inventory
from services.lifecycle.loop import inventory_problems, inventory_rows
from services.lifecycle.run import decide_fleet
from services.lifecycle.settings import EconomicsSection
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import lifecycle as store
from shared.store.lifecycle import GpuInputs
from tests.helpers.identities import VIEWER, as_role, token_args

FAILED, FAILING, WELL = (f"GPU-{n}aaaaaaa-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))
T1 = datetime(2026, 6, 1, 12, tzinfo=UTC)
T2 = T1 + timedelta(hours=1)


def _gpus() -> dict[str, GpuInputs]:
    busy: dict[str, Any] = dict(utilisation=0.9, power_w=700.0, work="training", job_gpus=8, resets_30d=0)
    return {
        FAILED: GpuInputs(
            FAILED, '=HYPERLINK("http://x")', "H100", "1650000000001", "unhealthy", "send_for_repair", **busy
        ),
        FAILING: GpuInputs(FAILING, "node-b", "H100", None, "healthy", "none", 0.4, T1, [], **busy),
        WELL: GpuInputs(WELL, "node-b", "H100", None, "healthy", "none", 0.01, T1, [], **busy),
    }


@pytest.fixture
def decided(migrated: DatabaseSettings) -> dict[str, Any]:
    """Two runs of three GPUs: the failed one under warranty, the failing one's warranty ending in 10 days."""
    text = (
        "serial,gpu_uuid,purchase_date,purchase_price,warranty_end,rma_turnaround_days,spares_on_hand,note\n"
        f"1650000000001,,2025-01-01,30000,2027-06-01,21,0,\n"
        f",{FAILING},2023-06-11,30000,{date(2026, 6, 11)},21,0,\n"
        f",{WELL},2025-01-01,-30000,,,,\n"
    )
    inventory = parse_inventory(text.encode(), today=T1.date())
    with connect(migrated) as conn:
        for at in (T1, T2):
            result = decide_fleet(
                _gpus(),
                inventory=inventory,
                inventory_problem=None,
                remediation_seen=False,
                econ=EconomicsSection(),
                baseline=0.031,
                calibration=None,
                at=at,
                trigger="schedule",
                inventory_file=None,
            )
            store.replace_inventory(
                conn,
                rows=inventory_rows(inventory),
                problems=inventory_problems(inventory, None),
                loaded_at=at,
            )
            store.write_run(conn, result.run, result.rows)
    return {r["gpu_uuid"]: r for r in result.rows}


def test_the_newest_run_is_ranked_by_what_waiting_costs_with_totals(
    served_api: str, decided: dict[str, Any]
) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        body = client.get("/api/v1/lifecycle").json()
    assert body["run"]["time"] == "2026-06-01T13:00:00.000000Z"
    assert body["run"]["missing_inputs"][0]["input"] == "the remediation history"
    ranked = [d["gpu_uuid"] for d in body["decisions"]]
    assert ranked == sorted(decided, key=lambda u: -decided[u]["cost_of_waiting_per_day"])
    assert {d["gpu_uuid"]: d["decision"] for d in body["decisions"]} == {
        FAILED: "rma",
        FAILING: "rma",
        WELL: "keep",
    }
    rma = next(t for t in body["totals"]["by_decision"] if t["decision"] == "rma")
    waiting = decided[FAILED]["cost_of_waiting_per_day"] + decided[FAILING]["cost_of_waiting_per_day"]
    assert rma["gpus"] == 2
    assert rma["cost_of_waiting_per_day"] == pytest.approx(waiting)
    assert body["totals"]["said"] == [
        f"2 GPUs to send for RMA; expected cost of waiting {waiting:,.0f} USD per day"
    ]
    first = body["decisions"][0]
    assert {o["option"] for o in first["options"]} >= {"keep", "rma", "retire"}
    assert any(t["name"] == "p_fail_30d" or t["name"] == "failed" for t in first["terms"])


def test_filters_and_pages(served_api: str, decided: dict[str, Any]) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        keep = client.get("/api/v1/lifecycle", params={"decision": "keep"}).json()
        host = client.get("/api/v1/lifecycle", params={"host": "node-b", "min_waiting": 1}).json()
        first = client.get("/api/v1/lifecycle", params={"limit": 2}).json()
        rest = client.get("/api/v1/lifecycle", params={"limit": 2, "cursor": first["next_cursor"]}).json()
        typo = client.get("/api/v1/lifecycle", params={"decison": "rma"})
        bad = client.get("/api/v1/lifecycle", params={"decision": "sell"})
    assert [d["gpu_uuid"] for d in keep["decisions"]] == [WELL]
    assert keep["total"] == 1
    assert [d["gpu_uuid"] for d in host["decisions"]] == [FAILING]
    assert first["total"] == 3
    assert len(first["decisions"]) == 2
    assert [d["gpu_uuid"] for d in first["decisions"] + rest["decisions"]] == [
        d["gpu_uuid"] for d in client_all(served_api)
    ]
    assert rest["next_cursor"] is None
    assert typo.status_code == 422
    assert "decison" in typo.json()["detail"]
    assert bad.status_code == 422


def client_all(url: str) -> list[dict[str, Any]]:
    decisions: list[dict[str, Any]] = VIEWER.get(url + "/api/v1/lifecycle", timeout=10).json()["decisions"]
    return decisions


def test_the_csv_opens_in_a_spreadsheet_and_runs_nothing(served_api: str, decided: dict[str, Any]) -> None:
    response = VIEWER.get(served_api + "/api/v1/lifecycle/export.csv", params={"min_waiting": 0}, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert 'filename="gpu-lifecycle-20260601T1300Z.csv"' in response.headers["content-disposition"]
    raw = response.content.decode("utf-8")
    assert raw.startswith("\ufeff")
    assert "\r\n" in raw
    rows = list(csv.DictReader(io.StringIO(raw.removeprefix("\ufeff"))))
    assert [r["gpu_uuid"] for r in rows] == [d["gpu_uuid"] for d in client_all(served_api)]
    failed = next(r for r in rows if r["gpu_uuid"] == FAILED)
    assert failed["hostname"] == '\'=HYPERLINK("http://x")'  # shown as text, never run
    assert failed["serial"] == "1650000000001"
    assert failed["currency"] == "USD"
    assert float(failed["cost_of_waiting_per_day"]) == pytest.approx(
        decided[FAILED]["cost_of_waiting_per_day"]
    )
    well = next(r for r in rows if r["gpu_uuid"] == WELL)
    assert "the purchase price (the GPU has no inventory row) (assumed 30000.0)" in well["missing_inputs"]


def test_the_inventory_shows_its_rows_its_refusals_and_the_assumptions(
    served_api: str, decided: dict[str, Any]
) -> None:
    body = VIEWER.get(served_api + "/api/v1/lifecycle/inventory", timeout=10).json()
    assert [(r["line"], r["serial"], r["gpu_uuid"]) for r in body["rows"]] == [
        (2, "1650000000001", None),
        (3, None, FAILING),
    ]
    assert [(p["line"], p["gpu"]) for p in body["problems"]] == [(4, f"gpu_uuid {WELL}")]
    assert "purchase_price -30000: negative" in body["problems"][0]["problem"]
    assert body["run"]["assumptions"]["training_value_per_gpu_hour"] == 2.0


def test_a_gpus_decisions_over_time(served_api: str, decided: dict[str, Any]) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        first = client.get(f"/api/v1/gpus/{FAILING}/lifecycle", params={"limit": 1}).json()
        rest = client.get(f"/api/v1/gpus/{FAILING}/lifecycle", params={"cursor": first["next_cursor"]}).json()
        unknown = client.get("/api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000/lifecycle").json()
    assert [d["time"] for d in first["decisions"] + rest["decisions"]] == [
        "2026-06-01T13:00:00.000000Z",
        "2026-06-01T12:00:00.000000Z",
    ]
    assert first["total"] == 2
    assert unknown["decisions"] == []


def test_before_the_first_run_the_answers_are_empty_not_errors(served_api: str) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        body = client.get("/api/v1/lifecycle").json()
        exported = client.get("/api/v1/lifecycle/export.csv")
        inventory = client.get("/api/v1/lifecycle/inventory").json()
    assert body["run"] is None
    assert body["decisions"] == []
    assert body["totals"]["said"] == []
    assert exported.status_code == 200
    assert exported.text.removeprefix("\ufeff").startswith("decision,hostname,gpu_uuid")
    assert inventory == {"run": None, "rows": [], "problems": []}


def test_gpuhealth_lifecycle_lists_the_totals_and_the_dearest_first_and_exports_the_csv(
    served_api: str, decided: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main([*token_args("viewer"), "--url", served_api, "lifecycle", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(
        "decided 2026-06-01 13:00 UTC over 30 days, 3 GPUs, inventory 2 rows (1 refused)"
    )
    assert "missing for the whole fleet: the remediation history" in lines[1]
    assert "2 GPUs to send for RMA; expected cost of waiting" in lines[2]
    ranked = [line.split()[2] for line in lines[5:7]]
    assert ranked == ["rma", "rma"]
    assert lines[-1] == "amounts in USD (1 more: --limit)"
    assert "{" not in out
    assert (
        cli.main(
            [
                *token_args("viewer"),
                "--url",
                served_api,
                "lifecycle",
                "--decision",
                "keep",
                "--csv",
                str(tmp_path / "x.csv"),
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(io.StringIO((tmp_path / "x.csv").read_text("utf-8-sig"))))
    assert [r["gpu_uuid"] for r in rows] == [WELL]
    assert cli.main([*token_args("viewer"), "--url", served_api, "lifecycle", "--decision", "sell"]) == 2
    assert "422" in capsys.readouterr().err

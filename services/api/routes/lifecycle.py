"""Lifecycle decisions: the newest run's, ranked by what waiting costs, with totals; a CSV; the inventory.

The ranking is the newest run's decisions, the GPU whose waiting costs most
per day first. Totals say, per decision that acts, how many GPUs and what
waiting costs ("3 GPUs to send for RMA; expected cost of waiting 96 USD per
day"). The CSV export is the same list for a spreadsheet: one row per GPU,
UTF-8 with a byte-order mark and CRLF (what Excel opens as it is), and no cell
that a spreadsheet would run as a formula.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from shared.store import lifecycle

from ..answers.lifecycle import GpuLifecycle, LifecycleDecisions, LifecycleInventory
from ..deps import Db
from ..export import csv_cell
from ..paging import decode_cursor, page
from ..parameters import GpuPath, LifecycleFilters, LifecycleQuery, NoQuery, PageQuery

router = APIRouter(tags=["lifecycle"])

# What each decision asks someone to do, as the totals say it.
TO_DO = {
    "reset": "to reset or reseat and re-validate", "rma": "to send for RMA", "repair": "to send for repair",
    "repurpose": "to move to inference", "retire": "to retire",
    "undecided": "left open (no failure prediction yet)",
}  # fmt: skip
CSV_COLUMNS = (
    "decision",
    "hostname",
    "gpu_uuid",
    "serial",
    "model",
    "cost_of_waiting_per_day",
    "expected_cost",
    "keep_cost",
    "currency",
    "p_fail_30d",
    "warranty_end",
    "why",
    "missing_inputs",
    "decided_at",
)


def _said(by_decision: list[dict[str, Any]], currency: str) -> list[str]:
    lines = []
    for t in by_decision:
        if t["decision"] in TO_DO:
            gpus = f"{t['gpus']} GPU{'s' if t['gpus'] != 1 else ''}"
            waiting = f"; expected cost of waiting {t['cost_of_waiting_per_day']:,.0f} {currency} per day"
            lines.append(f"{gpus} {TO_DO[t['decision']]}" + (waiting if t["decision"] != "undecided" else ""))
    return lines


async def _ranked(
    db: Db, filters: LifecycleFilters, limit: int, after: tuple[float, str] | None
) -> dict[str, Any]:
    async with db.reading() as conn:
        run = await lifecycle.latest_run(conn)
        if run is None:
            return {"run": None, "rows": [], "total": 0, "by_decision": []}
        where = {
            "run": run["time"],
            "decision": filters.decision,
            "host": filters.host,
            "min_waiting": filters.min_waiting,
        }
        rows, total = await lifecycle.decisions_page(conn, **where, limit=limit, after=after)
        by_decision = await lifecycle.decision_totals(conn, **where)
    return {"run": run, "rows": rows, "total": total, "by_decision": by_decision}


@router.get("/lifecycle")
async def lifecycle_decisions(db: Db, query: Annotated[LifecycleQuery, Query()]) -> LifecycleDecisions:
    """Every GPU's lifecycle decision at the newest run, the dearest wait first, with totals per decision."""
    after = tuple(decode_cursor(query.cursor, [float, str])) if query.cursor else None
    found = await _ranked(db, query, query.limit + 1, after)
    listed = page(
        "decisions",
        found["rows"],
        total=found["total"],
        limit=query.limit,
        key=lambda r: (r["cost_of_waiting_per_day"], r["gpu_uuid"]),
    )
    by_decision = found["by_decision"]
    currency = found["run"]["currency"] if found["run"] else "USD"
    totals = {
        "gpus": sum(t["gpus"] for t in by_decision),
        "cost_of_waiting_per_day": sum(t["cost_of_waiting_per_day"] for t in by_decision),
        "by_decision": by_decision,
        "said": _said(by_decision, currency),
    }
    return LifecycleDecisions.model_validate({"run": found["run"], "totals": totals, **listed})


@router.get(
    "/lifecycle/export.csv",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "one row per GPU: " + ", ".join(CSV_COLUMNS),
        }
    },
)
async def lifecycle_csv(db: Db, query: Annotated[LifecycleFilters, Query()]) -> Response:
    """The newest run's decisions as a spreadsheet (the filters of /lifecycle, every row, no paging)."""
    found = await _ranked(db, query, 1_000_000, None)
    currency = found["run"]["currency"] if found["run"] else ""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for r in found["rows"]:
        missing = "; ".join(f"{m['input']} (assumed {m['assumed']})" for m in r["missing"])
        values = {**r, "currency": currency, "missing_inputs": missing, "decided_at": r["time"]}
        writer.writerow([csv_cell(values[c]) for c in CSV_COLUMNS])
    stamp = found["run"]["time"].strftime("%Y%m%dT%H%MZ") if found["run"] else "none"
    return Response(
        "\ufeff" + out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="gpu-lifecycle-{stamp}.csv"'},
    )


@router.get("/lifecycle/inventory")
async def lifecycle_inventory(db: Db, query: Annotated[NoQuery, Query()]) -> LifecycleInventory:
    """The operator's inventory as last loaded, each refused row with its line and why, the assumptions."""
    async with db.reading() as conn:
        run = await lifecycle.latest_run(conn)
        rows, problems = await lifecycle.inventory(conn)
    return LifecycleInventory.model_validate({"run": run, "rows": rows, "problems": problems})


@router.get("/gpus/{gpu_uuid}/lifecycle")
async def gpu_lifecycle(db: Db, gpu_uuid: GpuPath, query: Annotated[PageQuery, Query()]) -> GpuLifecycle:
    """One GPU's lifecycle decisions over time, newest first; an unknown GPU has none."""
    before = decode_cursor(query.cursor, [datetime])[0] if query.cursor else None
    async with db.reading() as conn:
        found, total = await lifecycle.gpu_decisions(conn, gpu_uuid, limit=query.limit + 1, before=before)
    listed = page("decisions", found, total=total, limit=query.limit, key=lambda r: (r["time"],))
    return GpuLifecycle.model_validate({"gpu_uuid": gpu_uuid, **listed})

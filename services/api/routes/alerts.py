"""Alerts: the list, most severe then newest first, and acknowledging one (an operator's)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from shared.store import alerts as alert_store
from shared.store import fleet

from ..answers import problems
from ..answers.alerts import Alert, Alerts
from ..deps import Database, Db, Operator
from ..paging import decode_cursor, page
from ..parameters import AlertsQuery, NoQuery

router = APIRouter(tags=["alerts"])


async def alert_list(db: Database, query: AlertsQuery) -> Alerts:
    after = tuple(decode_cursor(query.cursor, [int, datetime, int])) if query.cursor else None
    filters = alert_store.AlertFilters(
        state=query.state, severity=query.severity, gpu=query.gpu, host=query.host
    )
    async with db.reading() as conn:
        found, total = await alert_store.listed(conn, filters, limit=query.limit + 1, after=after)
    listed = page(
        "alerts",
        found,
        total=total,
        limit=query.limit,
        key=lambda r: (r["severity_rank"], r["opened_at"], r["id"]),
    )
    return Alerts.model_validate(listed)


@router.get("/alerts")
async def alerts(db: Db, query: Annotated[AlertsQuery, Query()]) -> Alerts:
    """Alerts, most severe then newest first, each naming its GPU's host, index and rack."""
    return await alert_list(db, query)


@router.post(
    "/alerts/{alert_id}/acknowledge",
    responses=problems(
        {
            401: "no bearer token, or one refused",
            403: "the caller is not an operator",
            404: "no such alert",
            409: "the alert is not open (acknowledged or resolved already)",
        }
    ),
)
async def acknowledge(
    db: Db,
    alert_id: Annotated[int, Path(ge=1, le=2**62)],
    query: Annotated[NoQuery, Query()],
    who: Operator,
) -> Alert:
    """Acknowledge an open alert (an operator's); it still resolves when its evidence is gone. The
    acknowledger recorded is the token's subject (a body is ignored)."""
    async with db.acknowledging() as conn:
        done = await alert_store.acknowledge(conn, alert_id, who.subject)
    async with db.reading() as conn:
        if done is not None:
            where: dict[str, Any] = {"hostname": "", "gpu_index": None, "rack": None}
            where.update(await fleet.placement(conn, done["gpu_uuid"]) or {})
            return Alert.model_validate({**done, **where})
        state = await alert_store.alert_state(conn, alert_id)
    if state is None:
        raise HTTPException(404, f"no alert {alert_id}")
    raise HTTPException(409, f"alert {alert_id} is {state}, not open")

"""The fleet as a whole: its summary (kept until the scorer's next cycle) and its GPUs ranked by risk."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from shared.store import fleet, health

from ..answers import FRESHNESS
from ..answers.fleet import FleetSummary, Predictions
from ..cache import CycleCache, Served
from ..deps import Database, Db, State
from ..paging import decode_cursor, page
from ..parameters import NoQuery, PredictionsQuery

router = APIRouter(tags=["fleet"])


async def summary_json(db: Database, cache: CycleCache, missing_after_s: float) -> Served:
    """The fleet summary, encoded: cached until the scorer's next cycle (then stale while it refreshes)."""

    async def compute() -> FleetSummary:
        async with db.reading() as conn:
            found = await fleet.summary(conn, missing_after_s=missing_after_s)
        return FleetSummary.model_validate(
            {**found.totals, "open_alerts": found.open_alerts, "by_location": found.by_location}
        )

    return await cache.get_or_compute(("summary",), compute)


@router.get("/fleet/summary", response_model=FleetSummary, responses=FRESHNESS)
async def fleet_summary(state: State, query: Annotated[NoQuery, Query()]) -> Response:
    """GPU counts by state and location, fleet aggregates, open alerts, GPUs missing.

    Cached: `Age` says how old the answer is, `Cache-Status` whether it is stale.
    """
    served = await summary_json(state.db, state.cache, state.missing_after_s)
    return Response(served.body, media_type="application/json", headers=served.headers())


@router.get("/predictions")
async def predictions(db: Db, query: Annotated[PredictionsQuery, Query()]) -> Predictions:
    """GPUs ranked by their risk of failing within 30 days, with the reasons."""
    after = tuple(decode_cursor(query.cursor, [float, str])) if query.cursor else None
    async with db.reading() as conn:
        found, total = await health.ranked_predictions(
            conn, min_p30=query.min_p30, limit=query.limit + 1, after=after
        )
    listed = page(
        "predictions", found, total=total, limit=query.limit, key=lambda r: (r["p_fail_30d"], r["gpu_uuid"])
    )
    return Predictions.model_validate(listed)

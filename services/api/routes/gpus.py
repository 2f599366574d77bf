"""The GPUs: the list (filtered, sorted, paged; kept until the scorer's next cycle) and one GPU in detail."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from shared.store import fleet
from shared.store.fleet import GpuFilters

from ..answers import FRESHNESS, problems
from ..answers.gpus import GpuDetail, GpuList
from ..cache import CycleCache, Served
from ..deps import Cache, Database, Db
from ..paging import decode_cursor, encode_cursor
from ..parameters import GpuListQuery, GpuPath, NoQuery

router = APIRouter(tags=["gpus"])


async def gpu_list_json(db: Database, cache: CycleCache, query: GpuListQuery) -> Served:
    """One page of the GPU list, encoded: cached until the next cycle (then stale while it refreshes)."""
    offset = query.offset
    if query.cursor is not None:
        (offset,) = decode_cursor(query.cursor, [int])
        if not 0 <= offset <= 1_000_000:
            raise HTTPException(400, "'cursor' is not one this endpoint returned; start without it")
    filters = GpuFilters(
        cluster=query.cluster,
        datacenter=query.datacenter,
        rack=query.rack,
        host=query.host,
        model=query.model,
        state=query.state,
    )

    async def compute() -> GpuList:
        async with db.reading() as conn:
            listed = await fleet.gpu_page(conn, filters, sort=query.sort, limit=query.limit, offset=offset)
        n, found = listed.total, listed.gpus
        more = offset + len(found) < n
        return GpuList.model_validate(
            {
                "gpus": found,
                "total": n,
                "limit": query.limit,
                "offset": offset,
                "next_cursor": encode_cursor([offset + len(found)]) if more and found else None,
            }
        )

    key = ("gpus", filters, query.sort, query.limit, offset)
    return await cache.get_or_compute(key, compute)


@router.get("/gpus", response_model=GpuList, responses=FRESHNESS)
async def list_gpus(db: Db, cache: Cache, query: Annotated[GpuListQuery, Query()]) -> Response:
    """GPUs with placement, state, score and latest readings; filtered, sorted, paginated.

    `next_cursor` continues the same filters and sort (it stands for the position, since
    the list sorts on readings that change); `offset` is kept for existing clients.
    Cached: `Age` says how old the answer is, `Cache-Status` whether it is stale.
    """
    served = await gpu_list_json(db, cache, query)
    return Response(served.body, media_type="application/json", headers=served.headers())


@router.get("/gpus/{gpu_uuid}", responses=problems({404: "no such GPU"}))
async def gpu_detail(db: Db, gpu_uuid: GpuPath, query: Annotated[NoQuery, Query()]) -> GpuDetail:
    """One GPU: identity, placement, latest sample, verdicts with evidence, action, prediction."""
    async with db.reading() as conn:
        found = await fleet.gpu_detail(conn, gpu_uuid)
    if found is None:
        raise HTTPException(404, f"no GPU {gpu_uuid}")
    return GpuDetail.model_validate(
        {
            "asset": found.asset,
            "latest": found.latest,
            "status": found.status,
            "verdicts": found.verdicts,
            "prediction": found.prediction,
            "open_alerts": found.open_alerts,
        }
    )

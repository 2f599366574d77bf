"""A GPU's verdict history: every change of state per subsystem, newest first, with its evidence."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from shared.store import health

from .paging import Cursor, decode_cursor, page
from .routes import GpuPath, connection, only

router = APIRouter(prefix="/api/v1")


@router.get("/gpus/{gpu_uuid}/history", dependencies=[only("limit", "cursor")])
async def gpu_history(
    request: Request,
    gpu_uuid: GpuPath,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """Verdict changes of one GPU (gpu_health), newest first; an unknown GPU has an empty history."""
    after = tuple(decode_cursor(cursor, [datetime, str])) if cursor else None
    async with connection(request.app.state.pool) as conn:
        found, total = await health.verdict_history(conn, gpu_uuid, limit=limit + 1, after=after)
    return {"gpu_uuid": gpu_uuid, **page("history", found, total=total, limit=limit,
                                           key=lambda r: (r["time"], r["subsystem"]))}  # fmt: skip

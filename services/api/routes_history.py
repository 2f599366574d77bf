"""A GPU's verdict history: every change of state per subsystem, newest first, with its evidence."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from .paging import Cursor, decode_cursor, page
from .routes import GpuPath, only, rows

router = APIRouter(prefix="/api/v1")


@router.get("/gpus/{gpu_uuid}/history", dependencies=[only("limit", "cursor")])
async def gpu_history(
    request: Request,
    gpu_uuid: GpuPath,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """Verdict changes of one GPU (gpu_health), newest first; an unknown GPU has an empty history."""
    after = decode_cursor(cursor, [datetime, str]) if cursor else [None, None]
    params = {"g": gpu_uuid, "limit": limit + 1, "ct": after[0], "cs": after[1]}
    found = await rows(request, """
        SELECT time, subsystem, state, rule, evidence FROM gpu_health
        WHERE gpu_uuid = %(g)s
          AND (%(ct)s::timestamptz IS NULL OR (time, subsystem) < (%(ct)s, %(cs)s::text))
        ORDER BY time DESC, subsystem DESC LIMIT %(limit)s
    """, params)  # fmt: skip
    total = (await rows(request, "SELECT count(*) AS n FROM gpu_health WHERE gpu_uuid = %(g)s", params))[0][
        "n"
    ]
    return {"gpu_uuid": gpu_uuid, **page("history", found, total=total, limit=limit,
                                           key=lambda r: (r["time"], r["subsystem"]))}  # fmt: skip

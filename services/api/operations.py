"""The operations area, outside /api/v1 and open without a caller: liveness, readiness, the API's metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared.store import fleet

from .answers import NotReady, Ready
from .deps import Db, State

TEXT = {"schema": {"type": "string"}}

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_class=PlainTextResponse, responses={200: {"content": {"text/plain": TEXT}}})
async def healthz() -> PlainTextResponse:
    """The process serves (liveness); says nothing of the database."""
    return PlainTextResponse("ok\n")


@router.get("/readyz", response_model=Ready, responses={503: {"model": NotReady}})
async def readyz(db: Db) -> JSONResponse:
    """The database answers (readiness): 503 with the reason while it does not."""
    try:
        async with db.pool.connection(timeout=3) as conn:
            await fleet.reachable(conn)
    except Exception as e:
        return JSONResponse(status_code=503, content={"ready": False, "detail": str(e)[:200]})
    return JSONResponse({"ready": True})


PROMETHEUS: dict[int | str, dict[str, Any]] = {
    200: {"content": {CONTENT_TYPE_LATEST: TEXT}, "description": "Prometheus' text format"}
}


@router.get("/metrics", response_class=Response, responses=PROMETHEUS)
async def metrics(state: State) -> Response:
    """The API's own metrics: requests by route and status, latency by route, the cache's answers."""
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

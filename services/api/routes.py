"""REST endpoints under /api/v1. Every parameter is validated; every query is parameterised.

Unknown query parameters are refused (400) rather than ignored, so a typo in a
filter never silently returns the whole fleet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import psycopg
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request
from fastapi.responses import Response
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from shared.errors import DatabaseUnavailableError
from shared.models import GPU_UUID_PATTERN, EventKind
from shared.models_health import ALERT_STATES, AlertSeverity, HealthState
from shared.store import alerts as alert_store
from shared.store import fleet, health, history
from shared.store.fleet import SORTS, GpuFilters
from shared.store.history import EventFilters

from .guard import key_refusal
from .paging import Cursor, decode_cursor, encode_cursor, page, wire

router = APIRouter(prefix="/api/v1")

GPU_UUID = GPU_UUID_PATTERN
LABEL = r"^[A-Za-z0-9._:/@+-]{1,253}$"
Label = Annotated[str | None, Query(pattern=LABEL, max_length=253)]
State = HealthState
BUCKETS = {"10s": 10, "1m": 60, "5m": 300, "15m": 900, "1h": 3600, "6h": 21600, "1d": 86400}


def only(*names: str) -> Any:
    """A dependency refusing query parameters other than `names`."""

    def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - set(names))
        if unknown:
            raise HTTPException(
                400, f"unknown query parameters {unknown}; this endpoint takes {sorted(names)}"
            )

    return Depends(check)


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    """A connection of `pool`; a pool that cannot hand one out (the database is down) is DatabaseUnavailableError."""
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as e:  # PoolTimeout, or a connection the pool found broken
        raise DatabaseUnavailableError(f"database connection lost: {e}") from e


def json_bytes(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def summary(conn: AsyncConnection[Any], missing_after_s: float) -> dict[str, Any]:
    """The fleet summary as the API answers it."""
    found = await fleet.summary(conn, missing_after_s=missing_after_s)
    return {
        **wire(found.totals),
        "open_alerts": {"critical": 0, "warning": 0, "info": 0, **found.open_alerts},
        "by_location": wire(found.by_location),
    }


@router.get("/fleet/summary", dependencies=[only()], response_model=dict[str, Any])
async def fleet_summary(request: Request) -> Response:
    """GPU counts by state and location, fleet aggregates, open alerts, GPUs missing."""

    async def compute() -> dict[str, Any]:
        async with connection(request.app.state.pool) as conn:
            return await summary(conn, request.app.state.missing_after_s)

    return json_bytes(await request.app.state.cache.get_or_compute(("summary",), compute))


@router.get(
    "/gpus",
    dependencies=[
        only("cluster", "datacenter", "rack", "host", "model", "state", "sort", "limit", "offset", "cursor")
    ],
    response_model=dict[str, Any],
)
async def list_gpus(
    request: Request,
    cluster: Label = None,
    datacenter: Label = None,
    rack: Label = None,
    host: Label = None,
    model: Annotated[str | None, Query(max_length=128, pattern=r"^[A-Za-z0-9 ._-]+$")] = None,
    state: State | None = None,
    sort: Literal[tuple(SORTS)] = "score",  # type: ignore[valid-type]
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    cursor: Cursor = None,
) -> Response:
    """GPUs with placement, state, score and latest readings; filtered, sorted, paginated.

    `next_cursor` continues the same filters and sort (it stands for the position, since
    the list sorts on readings that change); `offset` is kept for existing clients.
    """
    if cursor is not None:
        (offset,) = decode_cursor(cursor, [int])
        if not 0 <= offset <= 1_000_000:
            raise HTTPException(400, "'cursor' is not one this endpoint returned; start without it")
    filters = GpuFilters(
        cluster=cluster, datacenter=datacenter, rack=rack, host=host, model=model, state=state
    )

    async def compute() -> dict[str, Any]:
        async with connection(request.app.state.pool) as conn:
            listed = await fleet.gpu_page(conn, filters, sort=sort, limit=limit, offset=offset)
        n, found = listed.total, wire(listed.gpus)
        more = offset + len(found) < n
        return {"gpus": found, "total": n, "limit": limit, "offset": offset,
                "next_cursor": encode_cursor([offset + len(found)]) if more and found else None}  # fmt: skip

    key = ("gpus", cluster, datacenter, rack, host, model, state, sort, limit, offset)
    return json_bytes(await request.app.state.cache.get_or_compute(key, compute))


GpuPath = Annotated[str, Path(pattern=GPU_UUID)]


@router.get("/gpus/{gpu_uuid}", dependencies=[only()])
async def gpu_detail(request: Request, gpu_uuid: GpuPath) -> dict[str, Any]:
    """One GPU: identity, placement, latest sample, verdicts with evidence, action, prediction."""
    async with connection(request.app.state.pool) as conn:
        found = await fleet.gpu_detail(conn, gpu_uuid)
    if found is None:
        raise HTTPException(404, f"no GPU {gpu_uuid}")
    latest = wire(found.latest)
    if latest is not None:
        latest["mig"] = latest.get("mig") or []  # no MIG instances: [], as on Kafka
    return {
        "asset": wire(found.asset),
        "latest": latest,
        "status": wire(found.status),
        "verdicts": wire(found.verdicts),
        "prediction": wire(found.prediction),
        "open_alerts": wire(found.open_alerts),
    }


def time_range(
    request: Request, start: datetime | None, end: datetime | None, default: timedelta
) -> tuple[datetime, datetime]:
    try:
        end = utc(end) if end else datetime.now(UTC)
        start = utc(start) if start else end - default
    except OverflowError:  # e.g. to=0001-01-01: in UTC, or a default window back, it is before year 1
        raise HTTPException(400, "'from'/'to' lie outside the calendar once in UTC") from None
    if start >= end:
        raise HTTPException(400, "'from' must be before 'to'")
    if end - start > timedelta(days=request.app.state.api.max_range_days):
        raise HTTPException(400, f"the range may span at most {request.app.state.api.max_range_days} days")
    return start, end


@router.get("/gpus/{gpu_uuid}/series", dependencies=[only("from", "to", "bucket")])
async def gpu_series(
    request: Request,
    gpu_uuid: GpuPath,
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None,
    bucket: Literal[tuple(BUCKETS)] = "1m",  # type: ignore[valid-type]
) -> dict[str, Any]:
    """Temperature, power, utilisation, memory and ECC over time; 1 minute and up from the rollup.

    A bucket too fine for the range is widened to the finest that keeps the answer within
    `max_points` (`bucket` says which was used, `requested_bucket` what was asked); if even
    a day is too fine, the range is shortened to its newest end (`from` says where it starts).
    """
    start, end = time_range(request, start, end, timedelta(hours=24))
    requested = bucket
    bucket, start = fit_bucket(bucket, start, end, request.app.state.api.max_points)
    async with connection(request.app.state.pool) as conn:
        points = await history.series(conn, gpu_uuid, start=start, end=end, bucket_s=BUCKETS[bucket])
    return {
        "gpu_uuid": gpu_uuid,
        "from": wire(start),
        "to": wire(end),
        "bucket": bucket,
        "requested_bucket": requested,
        "points": wire(points),
    }


def fit_bucket(bucket: str, start: datetime, end: datetime, max_points: int) -> tuple[str, datetime]:
    """The finest bucket, no finer than `bucket`, that covers start..end in at most `max_points` points."""
    span = (end - start).total_seconds()
    for name, seconds in BUCKETS.items():
        if seconds >= BUCKETS[bucket] and span / seconds <= max_points:
            return name, start
    widest = max(BUCKETS, key=BUCKETS.__getitem__)
    return widest, end - timedelta(seconds=BUCKETS[widest] * max_points)


@router.get("/events", dependencies=[only("gpu", "kind", "from", "to", "limit", "cursor")])
async def events(
    request: Request,
    gpu: Annotated[str | None, Query(pattern=GPU_UUID)] = None,
    kind: Literal[tuple(k.value for k in EventKind)] | None = None,  # type: ignore[valid-type]
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """GPU events (XIDs, double-bit errors, throttling, lost GPUs...), newest first."""
    start, end = time_range(request, start, end, timedelta(days=7))
    after = tuple(decode_cursor(cursor, [datetime, str, str])) if cursor else None
    async with connection(request.app.state.pool) as conn:
        found, total = await history.events(
            conn, EventFilters(start=start, end=end, gpu=gpu, kind=kind), limit=limit + 1, after=after
        )
    return page(
        "events", found, total=total, limit=limit, key=lambda r: (r["time"], r["gpu_uuid"], r["kind"])
    )


@router.get("/alerts", dependencies=[only("state", "severity", "gpu", "host", "limit", "cursor")])
async def alerts(
    request: Request,
    state: Literal[(*ALERT_STATES, "unresolved")] = "unresolved",  # type: ignore[valid-type]
    severity: AlertSeverity | None = None,
    gpu: Annotated[str | None, Query(pattern=GPU_UUID)] = None,
    host: Label = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """Alerts, most severe then newest first, each naming its GPU's host, index and rack."""
    after = tuple(decode_cursor(cursor, [int, datetime, int])) if cursor else None
    filters = alert_store.AlertFilters(state=state, severity=severity, gpu=gpu, host=host)
    async with connection(request.app.state.pool) as conn:
        found, total = await alert_store.listed(conn, filters, limit=limit + 1, after=after)
    listed = page("alerts", found, total=total, limit=limit,
                  key=lambda r: (r["severity_rank"], r["opened_at"], r["id"]))  # fmt: skip
    for alert in listed["alerts"]:
        del alert["severity_rank"]
    return listed


@router.post("/alerts/{alert_id}/acknowledge", dependencies=[only()])
async def acknowledge(
    request: Request,
    alert_id: Annotated[int, Path(ge=1, le=2**62)],
    x_api_key: Annotated[str | None, Header(max_length=512)] = None,
    by: Annotated[str, Body(embed=True, pattern=LABEL)] = "api",
) -> dict[str, Any]:
    """Acknowledge an open alert (needs X-API-Key); it still resolves when its evidence is gone.

    The key was already checked, on the headers alone, before the body was read
    (services.api.guard); it is checked again here so the endpoint never depends on the order of layers.
    """
    if refusal := key_refusal(request.app.state.api.api_key, x_api_key):
        raise HTTPException(refusal.status, refusal.detail)
    async with connection(request.app.state.ack_pool) as conn:
        done = await alert_store.acknowledge(conn, alert_id, by)
    async with connection(request.app.state.pool) as conn:
        if done is not None:
            where = await fleet.placement(conn, done["gpu_uuid"])
            acked: dict[str, Any] = wire(
                {**done, "hostname": "", "gpu_index": None, "rack": None, **(where or {})}
            )
            return acked
        state = await alert_store.alert_state(conn, alert_id)
    if state is None:
        raise HTTPException(404, f"no alert {alert_id}")
    raise HTTPException(409, f"alert {alert_id} is {state}, not open")


@router.get("/predictions", dependencies=[only("limit", "min_p30", "cursor")])
async def predictions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    min_p30: Annotated[float, Query(ge=0, le=1)] = 0.0,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """GPUs ranked by their risk of failing within 30 days, with the reasons."""
    after = tuple(decode_cursor(cursor, [float, str])) if cursor else None
    async with connection(request.app.state.pool) as conn:
        found, total = await health.ranked_predictions(conn, min_p30=min_p30, limit=limit + 1, after=after)
    return page(
        "predictions", found, total=total, limit=limit, key=lambda r: (r["p_fail_30d"], r["gpu_uuid"])
    )

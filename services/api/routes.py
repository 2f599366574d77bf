"""REST endpoints under /api/v1. Every parameter is validated; every query is parameterised.

Unknown query parameters are refused (400) rather than ignored, so a typo in a
filter never silently returns the whole fleet.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request
from fastapi.responses import Response
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from .guard import key_refusal

router = APIRouter(prefix="/api/v1")

GPU_UUID = r"^(GPU|MIG)-[A-Za-z0-9/-]{8,96}$"
LABEL = r"^[A-Za-z0-9._:/@+-]{1,253}$"
Label = Annotated[str | None, Query(pattern=LABEL, max_length=253)]
State = Literal["healthy", "degraded", "unhealthy"]
BUCKETS = {"10s": 10, "1m": 60, "5m": 300, "15m": 900, "1h": 3600, "6h": 21600, "1d": 86400}
SORTS = {
    "score": "s.score ASC NULLS LAST", "-score": "s.score DESC NULLS LAST",
    "hostname": "a.hostname ASC, a.gpu_index ASC", "-hostname": "a.hostname DESC, a.gpu_index DESC",
    "temp": "l.gpu_temp_c ASC NULLS LAST", "-temp": "l.gpu_temp_c DESC NULLS LAST",
    "power": "l.power_usage_w ASC NULLS LAST", "-power": "l.power_usage_w DESC NULLS LAST",
}  # fmt: skip


def only(*names: str) -> Any:
    """A dependency refusing query parameters other than `names`."""

    def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - set(names))
        if unknown:
            raise HTTPException(
                400, f"unknown query parameters {unknown}; this endpoint takes {sorted(names)}"
            )

    return Depends(check)


async def rows(request: Request, query: str | sql.Composed, params: dict[str, Any]) -> list[dict[str, Any]]:
    pool: AsyncConnectionPool = request.app.state.pool
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()  # type: ignore[return-value]


def json_bytes(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


SUMMARY_TOTALS = """
    SELECT count(*) AS gpus,
           count(*) FILTER (WHERE s.state = 'healthy') AS healthy,
           count(*) FILTER (WHERE s.state = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.state = 'unhealthy') AS unhealthy,
           count(*) FILTER (WHERE s.state IS NULL) AS not_scored,
           count(*) FILTER (WHERE l.time IS NULL OR l.time < (SELECT max(time) FROM gpu_latest) - interval '2 minutes') AS missing,
           round(avg(l.gpu_temp_c)::numeric, 1)::float AS avg_temp_c,
           round(max(l.gpu_temp_c)::numeric, 1)::float AS max_temp_c,
           round(sum(l.power_usage_w)::numeric, 0)::float AS power_w,
           round(avg(l.gpu_util_pct)::numeric, 1)::float AS avg_util_pct
    FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid) LEFT JOIN gpu_latest l USING (gpu_uuid)
"""  # fmt: skip
SUMMARY_ALERTS = "SELECT severity, count(*) AS n FROM gpu_alerts WHERE state <> 'resolved' GROUP BY 1"
SUMMARY_PLACES = """
    SELECT a.cluster, a.datacenter, a.rack, count(*) AS gpus,
           count(*) FILTER (WHERE s.state = 'healthy') AS healthy,
           count(*) FILTER (WHERE s.state = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.state = 'unhealthy') AS unhealthy
    FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""  # fmt: skip


async def summary(conn: AsyncConnection[Any]) -> dict[str, Any]:
    """The summary's three statements on one connection, pipelined: one round trip."""
    async with conn.pipeline():
        totals, alerts, places = (
            await conn.execute(SUMMARY_TOTALS),
            await conn.execute(SUMMARY_ALERTS),
            await conn.execute(SUMMARY_PLACES),
        )
    return {
        **(await totals.fetchall())[0],
        "open_alerts": {r["severity"]: r["n"] for r in await alerts.fetchall()},
        "by_location": await places.fetchall(),
    }


@router.get("/fleet/summary", dependencies=[only()], response_model=dict[str, Any])
async def fleet_summary(request: Request) -> Response:
    """GPU counts by state and location, fleet aggregates, open alerts, GPUs missing."""

    async def compute() -> dict[str, Any]:
        async with request.app.state.pool.connection() as conn:
            return await summary(conn)

    return json_bytes(await request.app.state.cache.get_or_compute(("summary",), compute))


_LIST_FROM = """
    FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid) LEFT JOIN gpu_latest l USING (gpu_uuid)
    WHERE (%(cluster)s::text IS NULL OR a.cluster = %(cluster)s)
      AND (%(datacenter)s::text IS NULL OR a.datacenter = %(datacenter)s)
      AND (%(rack)s::text IS NULL OR a.rack = %(rack)s)
      AND (%(host)s::text IS NULL OR a.hostname = %(host)s)
      AND (%(model)s::text IS NULL OR a.model = %(model)s)
      AND (%(state)s::text IS NULL OR s.state = %(state)s)
"""


def gpu_list_statements(sort: str) -> tuple[str, sql.Composed]:
    """The GPU list's two statements (the total, the page) for a sort key of SORTS."""
    page = sql.SQL(
        "SELECT a.gpu_uuid, a.hostname, a.gpu_index, a.model, a.cluster, a.datacenter, a.rack,"
        " s.state, s.score, s.grade, s.action, l.time AS last_seen, l.gpu_temp_c, l.power_usage_w, l.gpu_util_pct "
        + _LIST_FROM
        + " ORDER BY {order}, a.gpu_uuid LIMIT %(limit)s OFFSET %(offset)s"
    ).format(order=sql.SQL(SORTS[sort]))
    return "SELECT count(*) AS n " + _LIST_FROM, page


@router.get(
    "/gpus",
    dependencies=[only("cluster", "datacenter", "rack", "host", "model", "state", "sort", "limit", "offset")],
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
) -> Response:
    """GPUs with placement, state, score and latest readings; filtered, sorted, paginated."""
    params = {"cluster": cluster, "datacenter": datacenter, "rack": rack, "host": host, "model": model,
              "state": state, "limit": limit, "offset": offset}  # fmt: skip
    count_query, query = gpu_list_statements(sort)

    async def compute() -> dict[str, Any]:
        async with request.app.state.pool.connection() as conn:
            async with conn.pipeline():
                total = await conn.execute(count_query, params)
                page = await conn.execute(query, params)
            n = (await total.fetchall())[0]["n"]
            return {"total": n, "limit": limit, "offset": offset, "gpus": await page.fetchall()}

    key = ("gpus", cluster, datacenter, rack, host, model, state, sort, limit, offset)
    return json_bytes(await request.app.state.cache.get_or_compute(key, compute))


GpuPath = Annotated[str, Path(pattern=GPU_UUID)]


@router.get("/gpus/{gpu_uuid}", dependencies=[only()])
async def gpu_detail(request: Request, gpu_uuid: GpuPath) -> dict[str, Any]:
    """One GPU: identity, placement, latest sample, verdicts with evidence, action, prediction."""
    p = {"g": gpu_uuid}
    asset = await rows(request, "SELECT * FROM gpu_assets WHERE gpu_uuid = %(g)s", p)
    if not asset:
        raise HTTPException(404, f"no GPU {gpu_uuid}")
    latest = await rows(request, "SELECT * FROM gpu_latest WHERE gpu_uuid = %(g)s", p)
    status = await rows(
        request,
        "SELECT state, score, grade, action, reasons, as_of FROM gpu_status WHERE gpu_uuid = %(g)s",
        p,
    )
    verdicts = await rows(
        request,
        "SELECT subsystem, state, rule, evidence, since FROM gpu_health_current WHERE gpu_uuid = %(g)s ORDER BY subsystem",
        p,
    )
    prediction = await rows(
        request,
        "SELECT time, p_fail_7d, p_fail_30d, reasons FROM gpu_failure_predictions WHERE gpu_uuid = %(g)s ORDER BY time DESC LIMIT 1",
        p,
    )
    alerts = await rows(
        request,
        "SELECT * FROM gpu_alerts WHERE gpu_uuid = %(g)s AND state <> 'resolved' ORDER BY opened_at DESC",
        p,
    )
    return {
        "asset": asset[0],
        "latest": latest[0] if latest else None,
        "status": status[0] if status else None,
        "verdicts": verdicts,
        "prediction": prediction[0] if prediction else None,
        "open_alerts": alerts,
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
    """Temperature, power, utilisation, memory and ECC over time; 1 minute and up from the rollup."""
    start, end = time_range(request, start, end, timedelta(hours=24))
    seconds = BUCKETS[bucket]
    if (end - start).total_seconds() / seconds > request.app.state.api.max_points:
        raise HTTPException(
            400, f"that is more than {request.app.state.api.max_points} points; pick a larger bucket"
        )
    params = {"g": gpu_uuid, "from": start, "to": end, "b": timedelta(seconds=seconds)}
    if seconds < 60:
        query = """SELECT time_bucket(%(b)s, time) AS t, avg(gpu_temp_c) AS temp_c, max(gpu_temp_c) AS temp_max_c,
                          avg(power_usage_w) AS power_w, avg(gpu_util_pct) AS util_pct, max(fb_used_mib) AS fb_used_mib,
                          max(ecc_sbe_volatile_total) AS ecc_sbe, max(ecc_dbe_volatile_total) AS ecc_dbe
                   FROM gpu_metrics WHERE gpu_uuid = %(g)s AND time >= %(from)s AND time < %(to)s
                   GROUP BY t ORDER BY t"""
    else:
        query = """SELECT time_bucket(%(b)s, bucket) AS t,
                          sum(gpu_temp_c_sum) / nullif(sum(gpu_temp_c_n), 0) AS temp_c, max(gpu_temp_c_max) AS temp_max_c,
                          sum(power_usage_w_sum) / nullif(sum(power_usage_w_n), 0) AS power_w,
                          sum(gpu_util_pct_sum) / nullif(sum(gpu_util_pct_n), 0) AS util_pct,
                          max(fb_used_mib_max) AS fb_used_mib,
                          max(ecc_sbe_volatile_total_max) AS ecc_sbe, max(ecc_dbe_volatile_total_max) AS ecc_dbe
                   FROM gpu_metrics_1min WHERE gpu_uuid = %(g)s AND bucket >= %(from)s AND bucket < %(to)s
                   GROUP BY t ORDER BY t"""
    return {
        "gpu_uuid": gpu_uuid,
        "from": start,
        "to": end,
        "bucket": bucket,
        "points": await rows(request, query, params),
    }


@router.get("/events", dependencies=[only("gpu", "kind", "from", "to", "limit")])
async def events(
    request: Request,
    gpu: Annotated[str | None, Query(pattern=GPU_UUID)] = None,
    kind: Literal[
        "xid",
        "ecc_dbe",
        "row_remap_failure",
        "retirement_pending",
        "throttle_start",
        "throttle_end",
        "gpu_lost",
        "gpu_back",
    ]
    | None = None,
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    start, end = time_range(request, start, end, timedelta(days=7))
    found = await rows(request, """
        SELECT time, gpu_uuid, kind, hostname, cluster, datacenter, rack, details FROM gpu_events
        WHERE time >= %(from)s AND time < %(to)s AND (%(gpu)s::text IS NULL OR gpu_uuid = %(gpu)s)
          AND (%(kind)s::text IS NULL OR kind = %(kind)s)
        ORDER BY time DESC LIMIT %(limit)s
    """, {"from": start, "to": end, "gpu": gpu, "kind": kind, "limit": limit})  # fmt: skip
    return {"events": found}


@router.get("/alerts", dependencies=[only("state", "severity", "gpu", "limit")])
async def alerts(
    request: Request,
    state: Literal["open", "acknowledged", "resolved", "unresolved"] = "unresolved",
    severity: Literal["info", "warning", "critical"] | None = None,
    gpu: Annotated[str | None, Query(pattern=GPU_UUID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    found = await rows(request, """
        SELECT * FROM gpu_alerts
        WHERE (%(state)s = 'unresolved' AND state <> 'resolved' OR state = %(state)s)
          AND (%(severity)s::text IS NULL OR severity = %(severity)s) AND (%(gpu)s::text IS NULL OR gpu_uuid = %(gpu)s)
        ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, opened_at DESC
        LIMIT %(limit)s
    """, {"state": state, "severity": severity, "gpu": gpu, "limit": limit})  # fmt: skip
    return {"alerts": found}


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
    ack_pool: AsyncConnectionPool = request.app.state.ack_pool
    async with ack_pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM acknowledge_alert(%(id)s, %(by)s)", {"id": alert_id, "by": by}
        )
        done: list[dict[str, Any]] = await cur.fetchall()  # type: ignore[assignment]
    if done:
        return done[0]
    exists = await rows(request, "SELECT state FROM gpu_alerts WHERE id = %(id)s", {"id": alert_id})
    if not exists:
        raise HTTPException(404, f"no alert {alert_id}")
    raise HTTPException(409, f"alert {alert_id} is {exists[0]['state']}, not open")


@router.get("/predictions", dependencies=[only("limit", "min_p30")])
async def predictions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    min_p30: Annotated[float, Query(ge=0, le=1)] = 0.0,
) -> dict[str, Any]:
    """GPUs ranked by their risk of failing within 30 days, with the reasons."""
    found = await rows(request, """
        SELECT a.gpu_uuid, a.hostname, a.model, a.rack, p.time, p.p_fail_7d, p.p_fail_30d, p.reasons
        FROM gpu_assets a
        CROSS JOIN LATERAL (SELECT * FROM gpu_failure_predictions f WHERE f.gpu_uuid = a.gpu_uuid
                            ORDER BY time DESC LIMIT 1) p
        WHERE p.p_fail_30d >= %(min)s
        ORDER BY p.p_fail_30d DESC, a.gpu_uuid LIMIT %(limit)s
    """, {"min": min_p30, "limit": limit})  # fmt: skip
    return {"predictions": found}

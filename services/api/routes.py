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

from shared.models import GPU_UUID_PATTERN, EventKind
from shared.models_health import ALERT_STATES, AlertSeverity, HealthState

from .guard import key_refusal
from .paging import Cursor, decode_cursor, encode_cursor, page, wire

router = APIRouter(prefix="/api/v1")

GPU_UUID = GPU_UUID_PATTERN
LABEL = r"^[A-Za-z0-9._:/@+-]{1,253}$"
Label = Annotated[str | None, Query(pattern=LABEL, max_length=253)]
State = HealthState
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
        return wire(await cur.fetchall())  # type: ignore[no-any-return]


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
        **wire((await totals.fetchall())[0]),
        "open_alerts": {"critical": 0, "warning": 0, "info": 0, **{r["severity"]: r["n"] for r in await alerts.fetchall()}},
        "by_location": wire(await places.fetchall()),
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
    params = {"cluster": cluster, "datacenter": datacenter, "rack": rack, "host": host, "model": model,
              "state": state, "limit": limit, "offset": offset}  # fmt: skip
    count_query, query = gpu_list_statements(sort)

    async def compute() -> dict[str, Any]:
        async with request.app.state.pool.connection() as conn:
            async with conn.pipeline():
                total = await conn.execute(count_query, params)
                page = await conn.execute(query, params)
            n = (await total.fetchall())[0]["n"]
            found = wire(await page.fetchall())
        more = offset + len(found) < n
        return {"gpus": found, "total": n, "limit": limit, "offset": offset,
                "next_cursor": encode_cursor([offset + len(found)]) if more and found else None}  # fmt: skip

    key = ("gpus", cluster, datacenter, rack, host, model, state, sort, limit, offset)
    return json_bytes(await request.app.state.cache.get_or_compute(key, compute))


GpuPath = Annotated[str, Path(pattern=GPU_UUID)]
# Series of the counters behind findings (name in the answer -> column; the rollup keeps `<column>_max`).
COUNTERS = {
    "fb_used_mib": "fb_used_mib", "ecc_sbe": "ecc_sbe_volatile_total", "ecc_dbe": "ecc_dbe_volatile_total",
    "retired_pages_sbe": "retired_pages_sbe", "retired_pages_dbe": "retired_pages_dbe",
    "retired_pages_pending": "retired_pages_pending", "remapped_rows_uncorrectable": "remapped_rows_uncorrectable",
    "row_remap_failure": "row_remap_failure", "pcie_replay": "pcie_replay_total", "xid_last": "xid_last",
    "nvlink_crc_flit_errors": "nvlink_crc_flit_errors_total", "nvlink_crc_data_errors": "nvlink_crc_data_errors_total",
    "nvlink_replay_errors": "nvlink_replay_errors_total", "nvlink_recovery_errors": "nvlink_recovery_errors_total",
    "power_violation_us": "power_violation_us", "thermal_violation_us": "thermal_violation_us",
}  # fmt: skip


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
        "SELECT g.*, a.hostname, a.gpu_index FROM gpu_alerts g JOIN gpu_assets a USING (gpu_uuid)"
        " WHERE g.gpu_uuid = %(g)s AND g.state <> 'resolved' ORDER BY g.opened_at DESC",
        p,
    )
    if latest:
        latest[0]["mig"] = latest[0].get("mig") or []  # no MIG instances: [], as on Kafka
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
    """Temperature, power, utilisation, memory and ECC over time; 1 minute and up from the rollup.

    A bucket too fine for the range is widened to the finest that keeps the answer within
    `max_points` (`bucket` says which was used, `requested_bucket` what was asked); if even
    a day is too fine, the range is shortened to its newest end (`from` says where it starts).
    """
    start, end = time_range(request, start, end, timedelta(hours=24))
    requested = bucket
    bucket, start = fit_bucket(bucket, start, end, request.app.state.api.max_points)
    seconds = BUCKETS[bucket]
    params = {"g": gpu_uuid, "from": start, "to": end, "b": timedelta(seconds=seconds)}
    if seconds < 60:
        counters = ", ".join(f"max({column}) AS {name}" for name, column in COUNTERS.items())
        query = f"""SELECT time_bucket(%(b)s, time) AS t, avg(gpu_temp_c) AS temp_c, max(gpu_temp_c) AS temp_max_c,
                          avg(power_usage_w) AS power_w, avg(gpu_util_pct) AS util_pct, {counters}
                   FROM gpu_metrics WHERE gpu_uuid = %(g)s AND time >= %(from)s AND time < %(to)s
                   GROUP BY t ORDER BY t"""
    else:
        counters = ", ".join(f"max({column}_max) AS {name}" for name, column in COUNTERS.items())
        query = f"""SELECT time_bucket(%(b)s, bucket) AS t,
                          sum(gpu_temp_c_sum) / nullif(sum(gpu_temp_c_n), 0) AS temp_c, max(gpu_temp_c_max) AS temp_max_c,
                          sum(power_usage_w_sum) / nullif(sum(power_usage_w_n), 0) AS power_w,
                          sum(gpu_util_pct_sum) / nullif(sum(gpu_util_pct_n), 0) AS util_pct, {counters}
                   FROM gpu_metrics_1min WHERE gpu_uuid = %(g)s AND bucket >= %(from)s AND bucket < %(to)s
                   GROUP BY t ORDER BY t"""
    return {
        "gpu_uuid": gpu_uuid,
        "from": wire(start),
        "to": wire(end),
        "bucket": bucket,
        "requested_bucket": requested,
        "points": await rows(request, query, params),
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
    after = decode_cursor(cursor, [datetime, str, str]) if cursor else [None, None, None]
    params = {"from": start, "to": end, "gpu": gpu, "kind": kind, "limit": limit + 1,
              "ct": after[0], "cg": after[1], "ck": after[2]}  # fmt: skip
    where = """
        WHERE time >= %(from)s AND time < %(to)s AND (%(gpu)s::text IS NULL OR gpu_uuid = %(gpu)s)
          AND (%(kind)s::text IS NULL OR kind = %(kind)s)"""
    found = await rows(request, f"""
        SELECT time, gpu_uuid, kind, hostname, cluster, datacenter, rack, details FROM gpu_events {where}
          AND (%(ct)s::timestamptz IS NULL OR (time, gpu_uuid, kind) < (%(ct)s, %(cg)s::text, %(ck)s::text))
        ORDER BY time DESC, gpu_uuid DESC, kind DESC LIMIT %(limit)s
    """, params)  # fmt: skip
    total = (await rows(request, f"SELECT count(*) AS n FROM gpu_events {where}", params))[0]["n"]
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
    after = decode_cursor(cursor, [int, datetime, int]) if cursor else [None, None, None]
    params = {"state": state, "severity": severity, "gpu": gpu, "host": host, "limit": limit + 1,
              "cr": after[0], "co": after[1], "ci": after[2]}  # fmt: skip
    rank = "CASE g.severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END"
    base = """
        FROM gpu_alerts g LEFT JOIN gpu_assets a USING (gpu_uuid)
        WHERE (%(state)s = 'unresolved' AND g.state <> 'resolved' OR g.state = %(state)s)
          AND (%(severity)s::text IS NULL OR g.severity = %(severity)s)
          AND (%(gpu)s::text IS NULL OR g.gpu_uuid = %(gpu)s) AND (%(host)s::text IS NULL OR a.hostname = %(host)s)"""
    found = await rows(request, f"""
        SELECT g.*, {rank} AS severity_rank, coalesce(a.hostname, '') AS hostname, a.gpu_index, a.rack {base}
          AND (%(cr)s::int IS NULL OR {rank} > %(cr)s
               OR {rank} = %(cr)s AND (g.opened_at, g.id) < (%(co)s::timestamptz, %(ci)s::bigint))
        ORDER BY {rank}, g.opened_at DESC, g.id DESC LIMIT %(limit)s
    """, params)  # fmt: skip
    total = (await rows(request, f"SELECT count(*) AS n {base}", params))[0]["n"]
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
    ack_pool: AsyncConnectionPool = request.app.state.ack_pool
    async with ack_pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM acknowledge_alert(%(id)s, %(by)s)", {"id": alert_id, "by": by}
        )
        done: list[dict[str, Any]] = await cur.fetchall()  # type: ignore[assignment]
    if done:
        host = await rows(request, "SELECT hostname, gpu_index, rack FROM gpu_assets WHERE gpu_uuid = %(g)s",
                          {"g": done[0]["gpu_uuid"]})  # fmt: skip
        acked: dict[str, Any] = wire({**done[0], "hostname": "", "gpu_index": None, "rack": None,
                                      **(host[0] if host else {})})  # fmt: skip
        return acked
    exists = await rows(request, "SELECT state FROM gpu_alerts WHERE id = %(id)s", {"id": alert_id})
    if not exists:
        raise HTTPException(404, f"no alert {alert_id}")
    raise HTTPException(409, f"alert {alert_id} is {exists[0]['state']}, not open")


@router.get("/predictions", dependencies=[only("limit", "min_p30", "cursor")])
async def predictions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    min_p30: Annotated[float, Query(ge=0, le=1)] = 0.0,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """GPUs ranked by their risk of failing within 30 days, with the reasons."""
    after = decode_cursor(cursor, [float, str]) if cursor else [None, None]
    params = {"min": min_p30, "limit": limit + 1, "cp": after[0], "cg": after[1]}
    base = """
        FROM gpu_assets a
        CROSS JOIN LATERAL (SELECT * FROM gpu_failure_predictions f WHERE f.gpu_uuid = a.gpu_uuid
                            ORDER BY time DESC LIMIT 1) p
        WHERE p.p_fail_30d >= %(min)s"""
    found = await rows(request, f"""
        SELECT a.gpu_uuid, a.hostname, a.model, a.rack, p.time, p.p_fail_7d, p.p_fail_30d, p.reasons {base}
          AND (%(cp)s::float8 IS NULL OR p.p_fail_30d < %(cp)s
               OR p.p_fail_30d = %(cp)s AND a.gpu_uuid > %(cg)s::text)
        ORDER BY p.p_fail_30d DESC, a.gpu_uuid LIMIT %(limit)s
    """, params)  # fmt: skip
    total = (await rows(request, f"SELECT count(*) AS n {base}", params))[0]["n"]
    return page(
        "predictions", found, total=total, limit=limit, key=lambda r: (r["p_fail_30d"], r["gpu_uuid"])
    )

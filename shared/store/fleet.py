"""Fleet-wide reads over gpu_assets, gpu_status and gpu_latest: the summary, the GPU list, one GPU's detail.

Rows come back as `dict_row` dicts keyed by the statements' columns, in their
order (the order the API writes them out: its answer models say what each key
holds), whatever row factory the connection has; times stay datetimes (the API
formats them). The summary, the list and the detail are async (the API's pool);
the summary and the list also have a sync caller, the bench's baseline, running
the same statement text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from psycopg import sql
from psycopg.rows import dict_row, tuple_row

from .errors import translated
from .results import AsyncConn, Row, SyncConn, dict_rows, dict_rows_async, tuple_rows

# The newest sample of the fleet: what `latest` scoring and the evaluation judge as of,
# and what the summary measures a GPU's silence against.
NEWEST_SAMPLE = "SELECT max(time) FROM gpu_latest"

# The GPU list's sort keys (the API's `sort` values) -> their ORDER BY, ties broken by gpu_uuid.
SORTS = {
    "score": "s.score ASC NULLS LAST", "-score": "s.score DESC NULLS LAST",
    "hostname": "a.hostname ASC, a.gpu_index ASC", "-hostname": "a.hostname DESC, a.gpu_index DESC",
    "temp": "l.gpu_temp_c ASC NULLS LAST", "-temp": "l.gpu_temp_c DESC NULLS LAST",
    "power": "l.power_usage_w ASC NULLS LAST", "-power": "l.power_usage_w DESC NULLS LAST",
}  # fmt: skip


async def reachable(conn: AsyncConn) -> None:
    """Raise unless the database answers a trivial statement (the API's readiness)."""
    await dict_rows_async(conn, "SELECT 1")


def newest_sample_time(conn: SyncConn) -> datetime | None:
    """The time of the fleet's newest sample (None: nothing ingested yet)."""
    (newest,) = tuple_rows(conn, NEWEST_SAMPLE)[0]
    return newest  # type: ignore[no-any-return]


def hostnames(conn: SyncConn, gpu_uuids: list[str]) -> dict[str, str]:
    """The inventory's hostname of each of `gpu_uuids` it knows."""
    with translated(conn), conn.cursor(row_factory=tuple_row) as cur:
        found = cur.execute(
            "SELECT gpu_uuid, hostname FROM gpu_assets WHERE gpu_uuid = ANY(%s)", (gpu_uuids,)
        )
        return {str(uuid): str(host) for uuid, host in found}


class Placement(TypedDict):
    hostname: str
    gpu_index: int
    rack: str | None


async def placement(conn: AsyncConn, gpu_uuid: str) -> Placement | None:
    """Where the inventory places a GPU (None: not in the inventory)."""
    found = await dict_rows_async(
        conn, "SELECT hostname, gpu_index, rack FROM gpu_assets WHERE gpu_uuid = %(g)s", {"g": gpu_uuid}
    )
    return found[0] if found else None  # type: ignore[return-value]


# --- the fleet summary -------------------------------------------------------------------------

SUMMARY_TOTALS = f"""
    SELECT count(*) AS gpus,
           count(*) FILTER (WHERE s.state = 'healthy') AS healthy,
           count(*) FILTER (WHERE s.state = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.state = 'unhealthy') AS unhealthy,
           count(*) FILTER (WHERE s.state IS NULL) AS not_scored,
           count(*) FILTER (WHERE l.time IS NULL OR l.time < ({NEWEST_SAMPLE}) - %(missing_after)s) AS missing,
           round(avg(l.gpu_temp_c)::numeric, 1)::float AS avg_temp_c,
           round(max(l.gpu_temp_c)::numeric, 1)::float AS max_temp_c,
           round(sum(l.power_usage_w)::numeric, 0)::float AS power_w,
           round(avg(l.gpu_util_pct)::numeric, 1)::float AS avg_util_pct
    FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid) LEFT JOIN gpu_latest l USING (gpu_uuid)
"""
SUMMARY_ALERTS = "SELECT severity, count(*) AS n FROM gpu_alerts WHERE state <> 'resolved' GROUP BY 1"
SUMMARY_PLACES = """
    SELECT a.cluster, a.datacenter, a.rack, count(*) AS gpus,
           count(*) FILTER (WHERE s.state = 'healthy') AS healthy,
           count(*) FILTER (WHERE s.state = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.state = 'unhealthy') AS unhealthy
    FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""


@dataclass(frozen=True, slots=True)
class FleetSummary:
    totals: Row  # gpus, healthy, degraded, unhealthy, not_scored, missing, avg/max temp, power, avg util
    open_alerts: dict[str, int]  # unresolved alerts by severity (only severities that have some)
    by_location: list[Row]  # per (cluster, datacenter, rack): gpus, healthy, degraded, unhealthy


def _summary_statements(missing_after_s: float) -> list[tuple[str, dict[str, Any]]]:
    return [
        (SUMMARY_TOTALS, {"missing_after": timedelta(seconds=missing_after_s)}),
        (SUMMARY_ALERTS, {}),
        (SUMMARY_PLACES, {}),
    ]


def _summary(totals: list[Row], alerts: list[Row], places: list[Row]) -> FleetSummary:
    by_severity = {str(r["severity"]): int(r["n"]) for r in alerts}
    return FleetSummary(totals=totals[0], open_alerts=by_severity, by_location=places)


async def summary(conn: AsyncConn, *, missing_after_s: float) -> FleetSummary:
    """GPU counts by state and place, fleet aggregates, open alerts: three statements, one round trip."""
    with translated(conn):
        async with conn.pipeline():
            cursors = [conn.cursor(row_factory=dict_row) for _ in range(3)]
            for cur, (query, params) in zip(cursors, _summary_statements(missing_after_s), strict=True):
                await cur.execute(query, params)
        totals, alerts, places = [await cur.fetchall() for cur in cursors]
    return _summary(totals, alerts, places)


def summary_sync(conn: SyncConn, *, missing_after_s: float) -> FleetSummary:
    """`summary` on a sync connection, one statement after the other (the bench's baseline)."""
    totals, alerts, places = (dict_rows(conn, q, p) for q, p in _summary_statements(missing_after_s))
    return _summary(totals, alerts, places)


# --- the GPU list ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuFilters:
    """The GPU list's filters; None matches everything. Values are bound, never spliced into SQL."""

    cluster: str | None = None
    datacenter: str | None = None
    rack: str | None = None
    host: str | None = None
    model: str | None = None
    state: str | None = None


@dataclass(frozen=True, slots=True)
class GpuPage:
    total: int  # every GPU the filters match
    gpus: list[Row]  # identity and placement, state, score, grade, action, latest readings


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
    """The GPU list's two statements (the total, the page) for a sort key of SORTS (KeyError otherwise)."""
    page = sql.SQL(
        "SELECT a.gpu_uuid, a.hostname, a.gpu_index, a.model, a.cluster, a.datacenter, a.rack,"
        " s.state, s.score, s.grade, s.action, l.time AS last_seen, l.gpu_temp_c, l.power_usage_w, l.gpu_util_pct "
        + _LIST_FROM
        + " ORDER BY {order}, a.gpu_uuid LIMIT %(limit)s OFFSET %(offset)s"
    ).format(order=sql.SQL(SORTS[sort]))
    return "SELECT count(*) AS n " + _LIST_FROM, page


def gpu_list_params(filters: GpuFilters, *, limit: int, offset: int) -> dict[str, Any]:
    """The bound values of `gpu_list_statements`."""
    return {
        "cluster": filters.cluster,
        "datacenter": filters.datacenter,
        "rack": filters.rack,
        "host": filters.host,
        "model": filters.model,
        "state": filters.state,
        "limit": limit,
        "offset": offset,
    }


async def gpu_page(conn: AsyncConn, filters: GpuFilters, *, sort: str, limit: int, offset: int) -> GpuPage:
    """One page of the GPU list and the total the filters match, pipelined: one round trip."""
    count_query, page_query = gpu_list_statements(sort)
    params = gpu_list_params(filters, limit=limit, offset=offset)
    with translated(conn):
        async with conn.pipeline():
            total, found = conn.cursor(row_factory=dict_row), conn.cursor(row_factory=dict_row)
            await total.execute(count_query, params)
            await found.execute(page_query, params)
        n = (await total.fetchall())[0]["n"]
        return GpuPage(total=int(n), gpus=await found.fetchall())


def gpu_page_sync(conn: SyncConn, filters: GpuFilters, *, sort: str, limit: int, offset: int) -> GpuPage:
    """`gpu_page` on a sync connection, one statement after the other (the bench's baseline)."""
    count_query, page_query = gpu_list_statements(sort)
    params = gpu_list_params(filters, limit=limit, offset=offset)
    n = dict_rows(conn, count_query, params)[0]["n"]
    return GpuPage(total=int(n), gpus=dict_rows(conn, page_query, params))


# --- one GPU -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuDetail:
    asset: Row  # every column of gpu_assets
    latest: Row | None  # every column of gpu_latest (None: never sampled)
    status: Row | None  # state, score, grade, action, reasons, as_of (None: never scored)
    verdicts: list[Row]  # per subsystem: subsystem, state, rule, evidence, since
    prediction: Row | None  # time, p_fail_7d, p_fail_30d, reasons of the newest prediction
    open_alerts: list[Row]  # every column of gpu_alerts, with the GPU's hostname and gpu_index


_DETAIL = (
    "SELECT * FROM gpu_assets WHERE gpu_uuid = %(g)s",
    "SELECT * FROM gpu_latest WHERE gpu_uuid = %(g)s",
    "SELECT state, score, grade, action, reasons, as_of FROM gpu_status WHERE gpu_uuid = %(g)s",
    "SELECT subsystem, state, rule, evidence, since FROM gpu_health_current WHERE gpu_uuid = %(g)s"
    " ORDER BY subsystem",
    "SELECT time, p_fail_7d, p_fail_30d, reasons FROM gpu_failure_predictions WHERE gpu_uuid = %(g)s"
    " ORDER BY time DESC LIMIT 1",
    "SELECT g.*, a.hostname, a.gpu_index FROM gpu_alerts g JOIN gpu_assets a USING (gpu_uuid)"
    " WHERE g.gpu_uuid = %(g)s AND g.state <> 'resolved' ORDER BY g.opened_at DESC",
)


async def gpu_detail(conn: AsyncConn, gpu_uuid: str) -> GpuDetail | None:
    """One GPU's identity, latest sample, status, verdicts, prediction and open alerts (None: unknown)."""
    with translated(conn):
        async with conn.pipeline():
            cursors = [conn.cursor(row_factory=dict_row) for _ in _DETAIL]
            for cur, query in zip(cursors, _DETAIL, strict=True):
                await cur.execute(query, {"g": gpu_uuid})
        asset, latest, status, verdicts, prediction, alerts = [await cur.fetchall() for cur in cursors]
    if not asset:
        return None
    return GpuDetail(
        asset=asset[0],
        latest=latest[0] if latest else None,
        status=status[0] if status else None,
        verdicts=verdicts,
        prediction=prediction[0] if prediction else None,
        open_alerts=alerts,
    )

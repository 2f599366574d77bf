"""lifecycle_inventory, _runs, _decisions: the lifecycle service's reads and writes, and the API's reads.

The service reads each GPU's inputs in one pass per source over a window
(`decision_inputs`): its place (gpu_assets), serial (gpu_systems_latest),
verdict and action (gpu_status), newest prediction (gpu_failure_predictions),
utilisation and power (gpu_metrics_1min), work class and job size
(gpu_processes, gpu_process_polls), and resets in the last 30 days
(remediations, where the remediator has recorded anything). A run's inventory,
run row and decisions are written in the caller's transaction. The API's reads
are async, over the newest run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from .errors import translated
from .results import AsyncConn, Row, SyncConn, dict_rows_async, tuple_rows

INVENTORY_COLUMNS = (
    "line",
    "serial",
    "gpu_uuid",
    "purchase_date",
    "purchase_price",
    "warranty_end",
    "rma_turnaround_days",
    "spares_on_hand",
    "note",
    "loaded_at",
)
DECISION_COLUMNS = (
    "time",
    "gpu_uuid",
    "serial",
    "hostname",
    "model",
    "decision",
    "expected_cost",
    "keep_cost",
    "cost_of_waiting_per_day",
    "p_fail_30d",
    "warranty_end",
    "why",
    "options",
    "terms",
    "missing",
)
RUN_COLUMNS = (
    "time",
    "trigger",
    "inventory_file",
    "inventory_rows",
    "inventory_problems",
    "gpus",
    "currency",
    "horizon_days",
    "assumptions",
    "missing_inputs",
)
# The remediator's actions that count as a reset or reseat of the GPUs they name (schema/0030).
RESET_ACTIONS = ["reset_gpu", "reboot_node", "check_mechanicals", "run_diagnostics"]
WORK_CLASS = {
    "training": "training",
    "compute": "training",
    "gaming": "training",
    "inference": "inference",
    "llm_serving": "inference",
}


def _insert(table: str, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )


# --- the service's writes ---------------------------------------------------------------------------


def replace_inventory(
    conn: SyncConn,
    *,
    rows: list[tuple[Any, ...]],
    problems: list[tuple[int, str | None, str]],
    loaded_at: datetime,
) -> None:
    """The inventory as loaded now, replacing the last load (rows in INVENTORY_COLUMNS order, less
    loaded_at; problems as (line, gpu, problem)); no commit."""
    with translated(conn), conn.cursor() as cur:
        cur.execute("DELETE FROM lifecycle_inventory")
        cur.execute("DELETE FROM lifecycle_inventory_problems")
        cur.executemany(_insert("lifecycle_inventory", INVENTORY_COLUMNS), [(*r, loaded_at) for r in rows])
        cur.executemany(
            "INSERT INTO lifecycle_inventory_problems (line, gpu, problem, loaded_at)"
            " VALUES (%s, %s, %s, %s)",
            [(*p, loaded_at) for p in problems],
        )


def write_run(conn: SyncConn, run: dict[str, Any], decisions: list[dict[str, Any]]) -> None:
    """A run's row and its decisions (dicts keyed by RUN_COLUMNS and DECISION_COLUMNS); no commit."""
    jsonb = {"assumptions", "missing_inputs", "options", "terms", "missing"}

    def values(row: dict[str, Any], columns: tuple[str, ...]) -> tuple[Any, ...]:
        return tuple(Jsonb(row[c]) if c in jsonb else row[c] for c in columns)

    with translated(conn), conn.cursor() as cur:
        cur.execute(_insert("lifecycle_runs", RUN_COLUMNS), values(run, RUN_COLUMNS))
        cur.executemany(
            _insert("lifecycle_decisions", DECISION_COLUMNS), [values(d, DECISION_COLUMNS) for d in decisions]
        )


# --- the service's reads ----------------------------------------------------------------------------


@dataclass(slots=True)
class GpuInputs:
    """One GPU's inputs as the database has them; None: no source had it."""

    gpu_uuid: str
    hostname: str | None = None
    model: str | None = None
    serial: str | None = None
    state: str | None = None
    action: str | None = None
    p_fail_30d: float | None = None
    predicted_at: datetime | None = None
    prediction_reasons: list[dict[str, Any]] | None = None
    utilisation: float | None = None
    power_w: float | None = None
    work: str | None = None
    job_gpus: int | None = None
    resets_30d: int | None = None


_GPUS = """
    SELECT a.gpu_uuid, a.hostname, a.model, s.state, s.action
      FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid)
"""
_SERIALS = """
    SELECT g->>'uuid', g->>'serial' FROM gpu_systems_latest, jsonb_array_elements(record->'gpus') g
     WHERE g->>'serial' IS NOT NULL
"""
_PREDICTIONS = """
    SELECT DISTINCT ON (gpu_uuid) gpu_uuid, p_fail_30d, time, reasons FROM gpu_failure_predictions
     WHERE time >= %(since)s AND time <= %(as_of)s ORDER BY gpu_uuid, time DESC
"""
_USE = """
    SELECT gpu_uuid, sum(gpu_util_pct_sum) / nullif(sum(gpu_util_pct_n), 0) / 100,
           sum(power_usage_w_sum) / nullif(sum(power_usage_w_n), 0)
      FROM gpu_metrics_1min WHERE bucket >= %(since)s AND bucket <= %(as_of)s GROUP BY gpu_uuid
"""
_POLLS = """
    SELECT gpu_uuid, count(*), count(*) FILTER (WHERE process_count > 0) FROM gpu_process_polls
     WHERE time >= %(since)s AND time <= %(as_of)s GROUP BY gpu_uuid
"""
_CLASSES = """
    SELECT gpu_uuid, classification, count(*) FROM gpu_processes
     WHERE time >= %(since)s AND time <= %(as_of)s GROUP BY gpu_uuid, classification
"""
# A training GPU's job: the pod it ran most in the window, and how many GPUs that pod ran on.
_JOBS = """
    WITH pods AS (
        SELECT gpu_uuid, pod_uid, count(*) AS n FROM gpu_processes
         WHERE time >= %(since)s AND time <= %(as_of)s AND pod_uid IS NOT NULL
           AND classification IN ('training', 'compute')
         GROUP BY gpu_uuid, pod_uid),
    top AS (SELECT DISTINCT ON (gpu_uuid) gpu_uuid, pod_uid FROM pods ORDER BY gpu_uuid, n DESC, pod_uid),
    size AS (SELECT pod_uid, count(DISTINCT gpu_uuid) AS gpus FROM pods GROUP BY pod_uid)
    SELECT top.gpu_uuid, size.gpus FROM top JOIN size USING (pod_uid)
"""
_REMEDIATOR_SEEN = "SELECT EXISTS (SELECT FROM remediation_decisions WHERE decided_at >= %(since)s)"
_RESETS = """
    SELECT u, count(*) FROM remediations, unnest(gpu_uuids) AS u
     WHERE NOT dry_run AND state <> 'held' AND action = ANY(%(actions)s)
       AND created_at >= %(since)s AND created_at <= %(as_of)s
     GROUP BY u
"""


def decision_inputs(
    conn: SyncConn, *, as_of: datetime, since: datetime, processes_since: datetime, resets_since: datetime
) -> tuple[dict[str, GpuInputs], bool]:
    """Every GPU of the inventory of assets with what each source says of it, and whether the remediation
    history was there to read (False: the remediator recorded no decision since `resets_since`)."""
    window = {"since": since, "as_of": as_of}
    gpus = {
        str(u): GpuInputs(str(u), host, model, None, state, action)
        for u, host, model, state, action in tuple_rows(conn, _GPUS)
    }

    def each(rows: list[tuple[Any, ...]]) -> list[tuple[GpuInputs, tuple[Any, ...]]]:
        return [(gpus[str(r[0])], r[1:]) for r in rows if str(r[0]) in gpus]

    for g, (serial,) in each(tuple_rows(conn, _SERIALS)):
        g.serial = str(serial)
    for g, (p30, at, reasons) in each(tuple_rows(conn, _PREDICTIONS, window)):
        g.p_fail_30d, g.predicted_at, g.prediction_reasons = float(p30), at, reasons
    for g, (util, power) in each(tuple_rows(conn, _USE, window)):
        g.utilisation = None if util is None else min(max(float(util), 0.0), 1.0)
        g.power_w = None if power is None else max(float(power), 0.0)
    recent = {"since": processes_since, "as_of": as_of}
    busy: dict[str, float] = {}
    for g, (polls, with_processes) in each(tuple_rows(conn, _POLLS, recent)):
        busy[g.gpu_uuid] = int(with_processes) / max(int(polls), 1)
        g.work = "idle"
    by_class: dict[str, dict[str, int]] = {}
    for g, (cls, n) in each(tuple_rows(conn, _CLASSES, recent)):
        group = by_class.setdefault(g.gpu_uuid, {})
        group[WORK_CLASS.get(str(cls), "training")] = group.get(
            WORK_CLASS.get(str(cls), "training"), 0
        ) + int(n)
    for uuid, counts in by_class.items():
        if busy.get(uuid, 1.0) >= 0.1:  # processes in fewer than one poll in ten: idle
            gpus[uuid].work = max(sorted(counts), key=lambda c: counts[c])
    for g, (size,) in each(tuple_rows(conn, _JOBS, recent)):
        g.job_gpus = int(size)
    history = {"since": resets_since, "as_of": as_of, "actions": RESET_ACTIONS}
    (seen,) = tuple_rows(conn, _REMEDIATOR_SEEN, history)[0]
    if seen:
        for g in gpus.values():
            g.resets_30d = 0
        for g, (n,) in each(tuple_rows(conn, _RESETS, history)):
            g.resets_30d = int(n)
    return gpus, bool(seen)


# --- the API's reads --------------------------------------------------------------------------------


async def latest_run(conn: AsyncConn) -> Row | None:
    found = await dict_rows_async(conn, "SELECT * FROM lifecycle_runs ORDER BY time DESC LIMIT 1")
    return found[0] if found else None


def _filters(
    run: datetime, decision: str | None, host: str | None, min_waiting: float
) -> tuple[sql.Composed, dict[str, Any]]:
    where = [sql.SQL("time = %(run)s"), sql.SQL("cost_of_waiting_per_day >= %(min_waiting)s")]
    if decision:
        where.append(sql.SQL("decision = %(decision)s"))
    if host:
        where.append(sql.SQL("hostname = %(host)s"))
    params = {"run": run, "decision": decision, "host": host, "min_waiting": min_waiting}
    return sql.SQL(" AND ").join(where), params


async def decisions_page(
    conn: AsyncConn,
    *,
    run: datetime,
    decision: str | None,
    host: str | None,
    min_waiting: float,
    limit: int,
    after: tuple[float, str] | None,
) -> tuple[list[Row], int]:
    """The run's decisions, dearest wait first (then by GPU), one page after `after`; and how many match."""
    where, params = _filters(run, decision, host, min_waiting)
    page = where
    if after is not None:
        page = sql.SQL("{} AND (cost_of_waiting_per_day, gpu_uuid) < (%(a_cost)s, %(a_gpu)s)").format(where)
        params |= {"a_cost": after[0], "a_gpu": after[1]}
    query = sql.SQL(
        "SELECT * FROM lifecycle_decisions WHERE {} ORDER BY cost_of_waiting_per_day DESC, gpu_uuid DESC"
        " LIMIT %(limit)s"
    ).format(page)
    rows = await dict_rows_async(conn, query, params | {"limit": limit})
    (count,) = await dict_rows_async(
        conn, sql.SQL("SELECT count(*) AS n FROM lifecycle_decisions WHERE {}").format(where), params
    )
    return rows, int(count["n"])


async def decision_totals(
    conn: AsyncConn, *, run: datetime, decision: str | None, host: str | None, min_waiting: float
) -> list[Row]:
    """Per decision: GPUs, expected cost, and what waiting costs per day, over what the filters match."""
    where, params = _filters(run, decision, host, min_waiting)
    query = sql.SQL(
        "SELECT decision, count(*) AS gpus, coalesce(sum(expected_cost), 0) AS expected_cost,"
        " sum(cost_of_waiting_per_day) AS cost_of_waiting_per_day FROM lifecycle_decisions WHERE {}"
        " GROUP BY decision ORDER BY sum(cost_of_waiting_per_day) DESC, decision"
    ).format(where)
    return await dict_rows_async(conn, query, params)


async def gpu_decisions(
    conn: AsyncConn, gpu_uuid: str, *, limit: int, before: datetime | None
) -> tuple[list[Row], int]:
    """One GPU's decisions over time, newest first, older than `before`; and how many it has."""
    rows = await dict_rows_async(
        conn,
        "SELECT * FROM lifecycle_decisions WHERE gpu_uuid = %(g)s"
        " AND (%(before)s::timestamptz IS NULL OR time < %(before)s) ORDER BY time DESC LIMIT %(limit)s",
        {"g": gpu_uuid, "limit": limit, "before": before},
    )
    (count,) = await dict_rows_async(
        conn, "SELECT count(*) AS n FROM lifecycle_decisions WHERE gpu_uuid = %(g)s", {"g": gpu_uuid}
    )
    return rows, int(count["n"])


async def inventory(conn: AsyncConn) -> tuple[list[Row], list[Row]]:
    """The inventory's rows as last loaded, and the rows that load refused."""
    rows = await dict_rows_async(conn, "SELECT * FROM lifecycle_inventory ORDER BY line")
    problems = await dict_rows_async(conn, "SELECT * FROM lifecycle_inventory_problems ORDER BY line")
    return rows, problems

"""Alerts (gpu_alerts): opened, refreshed and resolved by the scorer, listed and acknowledged through the API.

An alert is open until its evidence is gone; an operator's acknowledgement
(the `acknowledge_alert` function, granted only to the acknowledging login)
moves it to `acknowledged` and the scorer still resolves it. The scorer's
writes run in its judgement's transaction (no commit here). One finding is one
alert whoever sees it first, the event fast path or the cycle, in one scorer
process or two: the database decides (the partial unique index
gpu_alerts_one_open), and only the writer that opened or resolved an alert
hears so, so only it announces it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from .errors import translated
from .results import Row, dict_rows_async, tuple_rows

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
ListedState = Literal["open", "acknowledged", "resolved", "unresolved"]  # unresolved: open or acknowledged


def unresolved(conn: SyncConn, gpus: Collection[str] | None = None) -> dict[tuple[str, str], int]:
    """The alerts of `gpus` (None: every GPU) not yet resolved: (gpu_uuid, kind) -> id."""
    found = tuple_rows(
        conn,
        "SELECT id, gpu_uuid, kind FROM gpu_alerts WHERE state <> 'resolved'"
        " AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))",
        {"gpus": None if gpus is None else sorted(gpus)},
        prepare=False,
    )
    return {(str(uuid), str(kind)): int(alert_id) for alert_id, uuid, kind in found}


def open_alert(
    conn: SyncConn,
    gpu_uuid: str,
    kind: str,
    *,
    severity: str,
    summary: str,
    evidence: dict[str, Any],
    as_of: datetime,
) -> int | None:
    """Open a new alert as of a judgement; its id, or None where that GPU has one of that kind unresolved."""
    opened = tuple_rows(
        conn,
        "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, evidence, opened_at, updated_at)"
        " VALUES (%s, %s, %s, 'open', %s, %s, %s, %s)"
        " ON CONFLICT (gpu_uuid, kind) WHERE state <> 'resolved' DO NOTHING RETURNING id",
        (gpu_uuid, kind, severity, summary, Jsonb(evidence), as_of, as_of),
    )
    return int(opened[0][0]) if opened else None


@dataclass(frozen=True, slots=True)
class Refresh:
    """An unresolved alert's severity, summary and evidence as a judgement sees them."""

    alert_id: int
    severity: str
    summary: str
    evidence: dict[str, Any]


def refresh_alerts(conn: SyncConn, refreshed: Collection[Refresh], as_of: datetime) -> None:
    """Unresolved alerts' severity, summary and evidence as of a judgement (their state is kept), in one
    round of statements however many there are."""
    if not refreshed:
        return
    with translated(conn), conn.cursor() as cur:
        cur.executemany(
            "UPDATE gpu_alerts SET severity = %s, summary = %s, evidence = %s, updated_at = %s WHERE id = %s",
            [(r.severity, r.summary, Jsonb(r.evidence), as_of, r.alert_id) for r in refreshed],
        )


def resolve_alert(conn: SyncConn, alert_id: int, as_of: datetime) -> bool:
    """An alert whose evidence is gone, resolved as of a judgement; False if it was resolved already."""
    done = tuple_rows(
        conn,
        "UPDATE gpu_alerts SET state = 'resolved', resolved_at = %s, updated_at = %s"
        " WHERE id = %s AND state <> 'resolved' RETURNING id",
        (as_of, as_of, alert_id),
    )
    return bool(done)


def open_counts(conn: SyncConn, gpus: Collection[str]) -> list[tuple[str, str, int]]:
    """(gpu_uuid, severity, open alerts) of `gpus`; acknowledged ones not counted."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, severity, count(*) FROM gpu_alerts"
        " WHERE gpu_uuid = ANY(%(gpus)s::text[]) AND state = 'open' GROUP BY gpu_uuid, severity",
        {"gpus": sorted(gpus)},
        prepare=False,
    )
    return [(str(uuid), str(severity), int(n)) for uuid, severity, n in found]


def unresolved_of_kinds(conn: SyncConn, kinds: Collection[str]) -> list[tuple[str, dict[str, Any]]]:
    """(kind, evidence) of every alert of `kinds` not resolved (the evaluation's shared findings)."""
    found = tuple_rows(
        conn,
        "SELECT kind, evidence FROM gpu_alerts WHERE state <> 'resolved' AND kind = ANY(%s)",
        (sorted(kinds),),
    )
    return [(str(kind), dict(evidence)) for kind, evidence in found]


# --- the API -----------------------------------------------------------------------------------

_RANK = "CASE g.severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END"
_LISTED = """
    FROM gpu_alerts g LEFT JOIN gpu_assets a USING (gpu_uuid)
    WHERE (%(state)s = 'unresolved' AND g.state <> 'resolved' OR g.state = %(state)s)
      AND (%(severity)s::text IS NULL OR g.severity = %(severity)s)
      AND (%(gpu)s::text IS NULL OR g.gpu_uuid = %(gpu)s) AND (%(host)s::text IS NULL OR a.hostname = %(host)s)"""


@dataclass(frozen=True, slots=True)
class AlertFilters:
    """The alert list's filters; None matches everything. Values are bound, never spliced into SQL."""

    state: ListedState = "unresolved"
    severity: str | None = None
    gpu: str | None = None
    host: str | None = None


async def listed(
    conn: AsyncConn, filters: AlertFilters, *, limit: int, after: tuple[int, datetime, int] | None
) -> tuple[list[Row], int]:
    """Alerts, most severe then newest first, after the (severity_rank, opened_at, id) key `after`; and the total.

    Each row: every column of gpu_alerts, `severity_rank` (0 critical, 1 warning, 2 info),
    its GPU's `hostname` ("" if not in the inventory), `gpu_index` and `rack`.
    """
    cr, co, ci = after or (None, None, None)
    params = {
        "state": filters.state,
        "severity": filters.severity,
        "gpu": filters.gpu,
        "host": filters.host,
        "limit": limit,
        "cr": cr,
        "co": co,
        "ci": ci,
    }
    found = await dict_rows_async(
        conn,
        f"""
        SELECT g.*, {_RANK} AS severity_rank, coalesce(a.hostname, '') AS hostname, a.gpu_index, a.rack {_LISTED}
          AND (%(cr)s::int IS NULL OR {_RANK} > %(cr)s
               OR {_RANK} = %(cr)s AND (g.opened_at, g.id) < (%(co)s::timestamptz, %(ci)s::bigint))
        ORDER BY {_RANK}, g.opened_at DESC, g.id DESC LIMIT %(limit)s
    """,
        params,
    )
    total = await dict_rows_async(conn, f"SELECT count(*) AS n {_LISTED}", params)
    return found, int(total[0]["n"])


async def acknowledge(conn: AsyncConn, alert_id: int, by: str) -> Row | None:
    """Acknowledge an open alert as `by` (the acknowledging login's connection); its row, None if not open."""
    done = await dict_rows_async(
        conn, "SELECT * FROM acknowledge_alert(%(id)s, %(by)s)", {"id": alert_id, "by": by}
    )
    return done[0] if done else None


async def alert_state(conn: AsyncConn, alert_id: int) -> str | None:
    """An alert's state (None: no such alert)."""
    found = await dict_rows_async(conn, "SELECT state FROM gpu_alerts WHERE id = %(id)s", {"id": alert_id})
    return str(found[0]["state"]) if found else None

"""Verdicts: gpu_status, gpu_health_current, gpu_health (history) and gpu_failure_predictions.

The scorer writes them once per cycle (`write_verdicts`, in the caller's
transaction) and reads the cycle's verdicts back for its Prometheus series; the
API reads one GPU's history and the fleet's ranked predictions; the evaluation
reads what the scorer decided. jsonb values (reasons, evidence) go in as plain
dicts and lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from .errors import translated
from .results import Row, dict_rows_async, tuple_rows

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class StatusRow:
    """A GPU's status line (gpu_status) as of a cycle."""

    gpu_uuid: str
    state: str
    score: float
    grade: str
    action: str
    reasons: list[dict[str, Any]]
    as_of: datetime


@dataclass(frozen=True, slots=True)
class VerdictRow:
    """One subsystem's verdict on a GPU as of a cycle: a gpu_health_current row, a gpu_health entry."""

    gpu_uuid: str
    subsystem: str
    state: str
    rule: str | None
    evidence: dict[str, Any]
    as_of: datetime


@dataclass(frozen=True, slots=True)
class PredictionRow:
    """A GPU's failure probabilities as of a cycle, with the terms that raised them."""

    gpu_uuid: str
    p_fail_7d: float
    p_fail_30d: float
    reasons: list[dict[str, Any]]
    as_of: datetime


_UPSERT_STATUS = (
    "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, reasons, as_of, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, now()) ON CONFLICT (gpu_uuid) DO UPDATE SET"
    " state = EXCLUDED.state, score = EXCLUDED.score, grade = EXCLUDED.grade, action = EXCLUDED.action,"
    " reasons = EXCLUDED.reasons, as_of = EXCLUDED.as_of, updated_at = now()"
)
# `since` is kept while the state stays the same, so it says when the GPU entered it.
_UPSERT_CURRENT = (
    "INSERT INTO gpu_health_current (gpu_uuid, subsystem, state, rule, evidence, since, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (gpu_uuid, subsystem) DO UPDATE SET"
    " since = CASE WHEN gpu_health_current.state = EXCLUDED.state THEN gpu_health_current.since"
    " ELSE EXCLUDED.since END, state = EXCLUDED.state, rule = EXCLUDED.rule,"
    " evidence = EXCLUDED.evidence, updated_at = EXCLUDED.updated_at"
)
_INSERT_HISTORY = (
    "INSERT INTO gpu_health (time, gpu_uuid, subsystem, state, rule, evidence)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_INSERT_PREDICTION = (
    "INSERT INTO gpu_failure_predictions (time, gpu_uuid, p_fail_7d, p_fail_30d, reasons)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)


def current_states(conn: SyncConn) -> dict[tuple[str, str], str]:
    """Every GPU's current state per subsystem: (gpu_uuid, subsystem) -> state."""
    found = tuple_rows(conn, "SELECT gpu_uuid, subsystem, state FROM gpu_health_current")
    return {(str(uuid), str(sub)): str(state) for uuid, sub, state in found}


def write_verdicts(
    conn: SyncConn,
    *,
    statuses: list[StatusRow],
    current: list[VerdictRow],
    changes: list[VerdictRow],
    predictions: list[PredictionRow],
) -> None:
    """A cycle's status lines, current verdicts, verdict changes (history) and predictions; no commit."""
    with translated(conn), conn.cursor() as cur:
        cur.executemany(_UPSERT_STATUS, [(s.gpu_uuid, s.state, s.score, s.grade, s.action, Jsonb(s.reasons),
                                          s.as_of) for s in statuses])  # fmt: skip
        cur.executemany(_UPSERT_CURRENT, [(v.gpu_uuid, v.subsystem, v.state, v.rule, Jsonb(v.evidence), v.as_of,
                                           v.as_of) for v in current])  # fmt: skip
        if changes:
            cur.executemany(_INSERT_HISTORY, [(v.as_of, v.gpu_uuid, v.subsystem, v.state, v.rule,
                                               Jsonb(v.evidence)) for v in changes])  # fmt: skip
        if predictions:
            cur.executemany(_INSERT_PREDICTION, [(p.as_of, p.gpu_uuid, p.p_fail_7d, p.p_fail_30d,
                                                  Jsonb(p.reasons)) for p in predictions])  # fmt: skip


# --- the verdicts a cycle wrote (the scorer's Prometheus series) --------------------------------


class ScoredGpu(TypedDict):
    gpu_uuid: str
    hostname: str  # "" for a GPU the inventory no longer holds
    state: str
    score: float


def scored_gpus(conn: SyncConn, as_of: datetime) -> list[ScoredGpu]:
    """The GPUs the cycle of `as_of` scored (gpu_status carries that cycle's time)."""
    found = tuple_rows(
        conn,
        "SELECT s.gpu_uuid, coalesce(a.hostname, ''), s.state, s.score"
        " FROM gpu_status s LEFT JOIN gpu_assets a USING (gpu_uuid) WHERE s.as_of = %s",
        (as_of,),
    )
    return [ScoredGpu(gpu_uuid=str(u), hostname=str(h), state=str(s), score=float(p)) for u, h, s, p in found]


def scored_subsystems(conn: SyncConn, as_of: datetime) -> list[tuple[str, str, str]]:
    """(gpu_uuid, subsystem, state) of every GPU the cycle of `as_of` scored."""
    found = tuple_rows(
        conn,
        "SELECT c.gpu_uuid, c.subsystem, c.state FROM gpu_health_current c JOIN gpu_status s USING (gpu_uuid)"
        " WHERE s.as_of = %s",
        (as_of,),
    )
    return [(str(u), str(sub), str(state)) for u, sub, state in found]


# --- what the scorer decided (the evaluation) --------------------------------------------------


def current_verdicts(
    conn: SyncConn, *, unhealthy_only: bool = False
) -> list[tuple[str, str, str, str | None]]:
    """(gpu_uuid, subsystem, state, rule) of every current verdict; only the non-healthy ones if asked."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, subsystem, state, rule FROM gpu_health_current"
        " WHERE NOT %(only)s OR state <> 'healthy'",
        {"only": unhealthy_only},
    )
    return [(str(u), str(s), str(st), None if r is None else str(r)) for u, s, st, r in found]


def actions(conn: SyncConn) -> dict[str, str]:
    """Every scored GPU's recommended action (gpu_status)."""
    return {str(u): str(a) for u, a in tuple_rows(conn, "SELECT gpu_uuid, action FROM gpu_status")}


# --- the API's reads ---------------------------------------------------------------------------


async def verdict_history(
    conn: AsyncConn, gpu_uuid: str, *, limit: int, after: tuple[datetime, str] | None
) -> tuple[list[Row], int]:
    """One GPU's verdict changes, newest first, from after the (time, subsystem) key `after`; and their total."""
    ct, cs = after or (None, None)
    params = {"g": gpu_uuid, "limit": limit, "ct": ct, "cs": cs}
    found = await dict_rows_async(conn, """
        SELECT time, subsystem, state, rule, evidence FROM gpu_health
        WHERE gpu_uuid = %(g)s
          AND (%(ct)s::timestamptz IS NULL OR (time, subsystem) < (%(ct)s, %(cs)s::text))
        ORDER BY time DESC, subsystem DESC LIMIT %(limit)s
    """, params)  # fmt: skip
    total = await dict_rows_async(conn, "SELECT count(*) AS n FROM gpu_health WHERE gpu_uuid = %(g)s", params)
    return found, int(total[0]["n"])


async def ranked_predictions(
    conn: AsyncConn, *, min_p30: float, limit: int, after: tuple[float, str] | None
) -> tuple[list[Row], int]:
    """GPUs by their newest p_fail_30d (at least `min_p30`), highest first, from after the
    (p_fail_30d, gpu_uuid) key `after`; and the total at least `min_p30`."""
    cp, cg = after or (None, None)
    params = {"min": min_p30, "limit": limit, "cp": cp, "cg": cg}
    base = """
        FROM gpu_assets a
        CROSS JOIN LATERAL (SELECT * FROM gpu_failure_predictions f WHERE f.gpu_uuid = a.gpu_uuid
                            ORDER BY time DESC LIMIT 1) p
        WHERE p.p_fail_30d >= %(min)s"""
    found = await dict_rows_async(conn, f"""
        SELECT a.gpu_uuid, a.hostname, a.model, a.rack, p.time, p.p_fail_7d, p.p_fail_30d, p.reasons {base}
          AND (%(cp)s::float8 IS NULL OR p.p_fail_30d < %(cp)s
               OR p.p_fail_30d = %(cp)s AND a.gpu_uuid > %(cg)s::text)
        ORDER BY p.p_fail_30d DESC, a.gpu_uuid LIMIT %(limit)s
    """, params)  # fmt: skip
    total = await dict_rows_async(conn, f"SELECT count(*) AS n {base}", params)
    return found, int(total[0]["n"])

"""Verdicts: gpu_status, gpu_health_current, gpu_health (history) and gpu_failure_predictions.

The scorer writes them once per judgement of a set of GPUs (its cycle's, or its
event fast path's), in the caller's transaction: first each GPU's status line,
claimed against the revision it read before its inputs (`claim_statuses`,
schema/0040), then the verdicts of the GPUs it claimed (`write_verdicts`). It
reads its GPUs' verdicts back for its Prometheus series; the API reads one GPU's
history and the fleet's ranked predictions; the evaluation reads what the
scorer decided. jsonb values (reasons, evidence) go in as plain dicts and lists.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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


# A status line is written only over the revision its judgement read before its inputs (0: none
# yet); rows go in GPU order, so two judgements of overlapping sets take the row locks in one order.
_CLAIM_STATUS = """
INSERT INTO gpu_status AS s (gpu_uuid, state, score, grade, action, reasons, as_of, updated_at, revision)
SELECT t.gpu_uuid, t.state, t.score, t.grade, t.action, t.reasons, t.as_of, now(), t.revision + 1
FROM unnest(%(gpus)s::text[], %(states)s::text[], %(scores)s::float8[], %(grades)s::text[], %(actions)s::text[],
            %(reasons)s::jsonb[], %(as_ofs)s::timestamptz[], %(revisions)s::bigint[])
     AS t(gpu_uuid, state, score, grade, action, reasons, as_of, revision)
ORDER BY t.gpu_uuid
ON CONFLICT (gpu_uuid) DO UPDATE SET
    state = EXCLUDED.state, score = EXCLUDED.score, grade = EXCLUDED.grade, action = EXCLUDED.action,
    reasons = EXCLUDED.reasons, as_of = EXCLUDED.as_of, updated_at = now(), revision = s.revision + 1
WHERE s.revision = EXCLUDED.revision - 1
RETURNING s.gpu_uuid
"""
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


def _gpus(gpus: Collection[str] | None) -> list[str] | None:
    return None if gpus is None else sorted(gpus)


def current_states(conn: SyncConn, gpus: Collection[str] | None = None) -> dict[tuple[str, str], str]:
    """The current state per subsystem of `gpus` (None: every GPU): (gpu_uuid, subsystem) -> state."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, subsystem, state FROM gpu_health_current"
        " WHERE %(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[])",
        {"gpus": _gpus(gpus)},
        prepare=False,
    )
    return {(str(uuid), str(sub)): str(state) for uuid, sub, state in found}


def revisions(conn: SyncConn, gpus: Collection[str] | None = None) -> dict[str, int]:
    """The status revision of `gpus` (None: every GPU) judged so far; a GPU never judged is absent (0)."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, revision FROM gpu_status WHERE %(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[])",
        {"gpus": _gpus(gpus)},
        prepare=False,
    )
    return {str(uuid): int(revision) for uuid, revision in found}


def claim_statuses(conn: SyncConn, statuses: Sequence[StatusRow], read: Mapping[str, int]) -> set[str]:
    """Write the status lines of the GPUs whose revision is still the one in `read` (absent: never judged);
    the GPUs written, whose status rows this transaction now holds. No commit."""
    if not statuses:
        return set()
    found = tuple_rows(
        conn,
        _CLAIM_STATUS,
        {
            "gpus": [s.gpu_uuid for s in statuses],
            "states": [s.state for s in statuses],
            "scores": [s.score for s in statuses],
            "grades": [s.grade for s in statuses],
            "actions": [s.action for s in statuses],
            "reasons": [Jsonb(s.reasons) for s in statuses],
            "as_ofs": [s.as_of for s in statuses],
            "revisions": [read.get(s.gpu_uuid, 0) for s in statuses],
        },
        prepare=False,
    )
    return {str(uuid) for (uuid,) in found}


def latest_predictions(conn: SyncConn, gpus: Collection[str]) -> list[PredictionRow]:
    """The newest prediction of each of `gpus` that has one."""
    found = tuple_rows(
        conn,
        "SELECT DISTINCT ON (gpu_uuid) gpu_uuid, p_fail_7d, p_fail_30d, reasons, time"
        " FROM gpu_failure_predictions WHERE gpu_uuid = ANY(%(gpus)s::text[]) ORDER BY gpu_uuid, time DESC",
        {"gpus": sorted(gpus)},
        prepare=False,
    )
    return [PredictionRow(str(u), float(p7), float(p30), list(r), t) for u, p7, p30, r, t in found]


def write_verdicts(
    conn: SyncConn,
    *,
    current: list[VerdictRow],
    changes: list[VerdictRow],
    predictions: list[PredictionRow],
) -> None:
    """The current verdicts, verdict changes (history) and predictions of GPUs claimed; no commit."""
    with translated(conn), conn.cursor() as cur:
        cur.executemany(
            _UPSERT_CURRENT,
            [
                (v.gpu_uuid, v.subsystem, v.state, v.rule, Jsonb(v.evidence), v.as_of, v.as_of)
                for v in current
            ],
        )
        if changes:
            cur.executemany(
                _INSERT_HISTORY,
                [(v.as_of, v.gpu_uuid, v.subsystem, v.state, v.rule, Jsonb(v.evidence)) for v in changes],
            )
        if predictions:
            cur.executemany(
                _INSERT_PREDICTION,
                [(p.as_of, p.gpu_uuid, p.p_fail_7d, p.p_fail_30d, Jsonb(p.reasons)) for p in predictions],
            )


# --- the verdicts a cycle wrote (the scorer's Prometheus series) --------------------------------


class ScoredGpu(TypedDict):
    """A judged GPU's status line as the scorer's Prometheus series show it."""

    gpu_uuid: str
    hostname: str  # "" for a GPU the inventory no longer holds
    state: str
    score: float


def scored_gpus(conn: SyncConn, gpus: Collection[str]) -> list[ScoredGpu]:
    """The status lines of `gpus` that have been judged (a scorer's share of the fleet)."""
    found = tuple_rows(
        conn,
        "SELECT s.gpu_uuid, coalesce(a.hostname, ''), s.state, s.score"
        " FROM gpu_status s LEFT JOIN gpu_assets a USING (gpu_uuid) WHERE s.gpu_uuid = ANY(%(gpus)s::text[])",
        {"gpus": sorted(gpus)},
        prepare=False,
    )
    return [ScoredGpu(gpu_uuid=str(u), hostname=str(h), state=str(s), score=float(p)) for u, h, s, p in found]


def scored_subsystems(conn: SyncConn, gpus: Collection[str]) -> list[tuple[str, str, str]]:
    """(gpu_uuid, subsystem, state) of every current verdict of `gpus`."""
    found = tuple_rows(
        conn,
        "SELECT gpu_uuid, subsystem, state FROM gpu_health_current WHERE gpu_uuid = ANY(%(gpus)s::text[])",
        {"gpus": sorted(gpus)},
        prepare=False,
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
    found = await dict_rows_async(
        conn,
        """
        SELECT time, subsystem, state, rule, evidence FROM gpu_health
        WHERE gpu_uuid = %(g)s
          AND (%(ct)s::timestamptz IS NULL OR (time, subsystem) < (%(ct)s, %(cs)s::text))
        ORDER BY time DESC, subsystem DESC LIMIT %(limit)s
    """,
        params,
    )
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
    found = await dict_rows_async(
        conn,
        f"""
        SELECT a.gpu_uuid, a.hostname, a.model, a.rack, p.time, p.p_fail_7d, p.p_fail_30d, p.reasons {base}
          AND (%(cp)s::float8 IS NULL OR p.p_fail_30d < %(cp)s
               OR p.p_fail_30d = %(cp)s AND a.gpu_uuid > %(cg)s::text)
        ORDER BY p.p_fail_30d DESC, a.gpu_uuid LIMIT %(limit)s
    """,
        params,
    )
    total = await dict_rows_async(conn, f"SELECT count(*) AS n {base}", params)
    return found, int(total[0]["n"])

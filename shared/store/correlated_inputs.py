"""What several GPUs show together: a job's crash across its GPUs, a fault across a node or a rack.

- A job crash: application XIDs (the catalogue's application class) on GPUs that ran one
  job, each within `window` of the one before. A GPU's job is the one its newest sample at
  or before the XID names: the `job` label, else the pod with its worker index taken off
  (`train-3f2a-worker-5` -> `train-3f2a`), in its namespace; with neither, the job key of
  the launched worker (torchrun, deepspeed, accelerate) its newest process listing at or
  before the XID shows (`launch/elastic:<run id>`, `launch/master:<addr>:<port>`).
- A node or rack fault: hardware XIDs (the codes the caller gives) and lost GPUs on
  several GPUs of one host, or of one rack across hosts, each within `window` of the one
  before.

An episode is returned when it spans at least `min_gpus` GPUs; with `gpus`, only episodes
touching one of those GPUs (a cycle judging a share of the fleet still sees whole episodes).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg

from .results import tuple_rows

SyncConn = psycopg.Connection[Any]


class Episode(NamedTuple):
    scope: str  # job, node, rack
    key: str  # namespace/job, the hostname, the rack
    first: datetime
    last: datetime
    gpus: list[str]
    hosts: list[str]
    codes: list[int]  # the XIDs seen (a lost GPU is not an XID)
    signals: int


_JOB_CRASHES = """
WITH app AS (
    SELECT e.gpu_uuid, e.time, (e.details->>'xid')::int AS code, e.hostname
    FROM gpu_events e
    WHERE e.kind = 'xid' AND e.time > %(t)s - %(reach)s AND e.time <= %(t)s AND e.details ? 'xid'
      AND (e.details->>'xid')::int = ANY(%(codes)s::int[])
), labelled AS (
    SELECT a.*, CASE WHEN coalesce(nullif(m.job, ''), nullif(m.pod, '')) IS NOT NULL
               THEN coalesce(m.namespace, '') || '/' || coalesce(
                   nullif(m.job, ''), regexp_replace(m.pod, '-(worker-|rank-|node-)?[0-9]+$', ''))
               ELSE 'launch/' || p.job_key END AS job
    FROM app a LEFT JOIN LATERAL (
        SELECT g.namespace, g.job, g.pod FROM gpu_metrics g
        WHERE g.gpu_uuid = a.gpu_uuid AND g.time <= a.time AND g.time > a.time - interval '15 minutes'
        ORDER BY g.time DESC LIMIT 1
    ) m ON true LEFT JOIN LATERAL (
        SELECT min(q.job_key) AS job_key FROM gpu_processes q
        WHERE q.gpu_uuid = a.gpu_uuid AND q.time = (
            SELECT max(pp.time) FROM gpu_process_polls pp
            WHERE pp.gpu_uuid = a.gpu_uuid AND pp.time <= a.time AND pp.time > a.time - interval '15 minutes')
    ) p ON true
    WHERE coalesce(nullif(m.job, ''), nullif(m.pod, ''), p.job_key) IS NOT NULL
), marked AS (
    SELECT *, CASE WHEN time - lag(time) OVER w <= %(window)s THEN 0 ELSE 1 END AS starts
    FROM labelled WINDOW w AS (PARTITION BY job ORDER BY time)
), episodes AS (
    SELECT 'job' AS scope, job AS key, min(time) AS first, max(time) AS last,
           array_agg(DISTINCT gpu_uuid) AS gpus, array_agg(DISTINCT hostname) AS hosts,
           array_agg(DISTINCT code) AS codes, count(*) AS signals
    FROM (SELECT *, sum(starts) OVER (PARTITION BY job ORDER BY time) AS episode FROM marked) m
    GROUP BY job, episode
    HAVING count(DISTINCT gpu_uuid) >= %(min_gpus)s
)
SELECT * FROM episodes WHERE %(gpus)s::text[] IS NULL OR gpus && %(gpus)s::text[]
"""

_PLACE_FAULTS = """
WITH hw AS (
    SELECT e.gpu_uuid, e.time, CASE WHEN e.kind = 'xid' THEN (e.details->>'xid')::int END AS code,
           e.hostname, coalesce(e.rack, a.rack) AS rack
    FROM gpu_events e LEFT JOIN gpu_assets a USING (gpu_uuid)
    WHERE e.time > %(t)s - %(reach)s AND e.time <= %(t)s
      AND (e.kind = 'gpu_lost' OR (e.kind = 'xid' AND (e.details->>'xid')::int = ANY(%(codes)s::int[])))
), placed AS (
    SELECT 'node' AS scope, hostname AS key, * FROM hw
    UNION ALL
    SELECT 'rack', rack, * FROM hw WHERE rack IS NOT NULL
), marked AS (
    SELECT *, CASE WHEN time - lag(time) OVER w <= %(window)s THEN 0 ELSE 1 END AS starts
    FROM placed WINDOW w AS (PARTITION BY scope, key ORDER BY time)
), episodes AS (
    SELECT scope, key, min(time) AS first, max(time) AS last, array_agg(DISTINCT gpu_uuid) AS gpus,
           array_agg(DISTINCT hostname) AS hosts,
           coalesce(array_agg(DISTINCT code) FILTER (WHERE code IS NOT NULL), '{}') AS codes,
           count(*) AS signals
    FROM (SELECT *, sum(starts) OVER (PARTITION BY scope, key ORDER BY time) AS episode FROM marked) m
    GROUP BY scope, key, episode
    HAVING count(DISTINCT gpu_uuid) >= %(min_gpus)s AND (scope = 'node' OR count(DISTINCT hostname) >= 2)
)
SELECT * FROM episodes WHERE %(gpus)s::text[] IS NULL OR gpus && %(gpus)s::text[]
"""


def _episodes(
    conn: SyncConn,
    query: str,
    as_of: datetime,
    *,
    reach_s: float,
    window_s: float,
    min_gpus: int,
    codes: Collection[int],
    gpus: Collection[str] | None,
) -> list[Episode]:
    params = {
        "t": as_of,
        "reach": timedelta(seconds=reach_s),
        "window": timedelta(seconds=window_s),
        "min_gpus": min_gpus,
        "codes": sorted(codes),
        "gpus": None if gpus is None else sorted(gpus),
    }
    return [Episode(*row) for row in tuple_rows(conn, query, params)]


def job_crashes(
    conn: SyncConn,
    as_of: datetime,
    *,
    reach_s: float,
    window_s: float,
    min_gpus: int,
    codes: Collection[int],
    gpus: Collection[str] | None = None,
) -> list[Episode]:
    """Jobs whose GPUs logged application XIDs (`codes`) together within the last `reach_s`."""
    return _episodes(
        conn,
        _JOB_CRASHES,
        as_of,
        reach_s=reach_s,
        window_s=window_s,
        min_gpus=min_gpus,
        codes=codes,
        gpus=gpus,
    )


def place_faults(
    conn: SyncConn,
    as_of: datetime,
    *,
    reach_s: float,
    window_s: float,
    min_gpus: int,
    codes: Collection[int],
    gpus: Collection[str] | None = None,
) -> list[Episode]:
    """Hosts and racks whose GPUs showed hardware XIDs (`codes`) or were lost together."""
    return _episodes(
        conn,
        _PLACE_FAULTS,
        as_of,
        reach_s=reach_s,
        window_s=window_s,
        min_gpus=min_gpus,
        codes=codes,
        gpus=gpus,
    )

"""One GPU over a time range: what ran on it (jobs, processes, classes), its verdicts, alerts and events.

The answer to "what was on this GPU when it failed". Each list is of the range
[start, end), oldest first, at most `limit` rows (`limit + 1` are read, so the
caller can say a list was cut):

- jobs: the label sets its samples carried (host, cluster, job, pod,
  namespace), from gpu_usage_1min (kept a year): first and last sample, the
  minutes it had samples in, its busy share;
- classes: the process classes and users of its polls, from gpu_work_1min
  (a year), by the minute;
- processes: each process its polls listed (pid, start time, command, user,
  class, rule, pod), from gpu_processes (kept 30 days): first and last poll,
  polls, the most memory it held;
- verdicts: the verdict each subsystem was in at the start (`before` true)
  and every change in the range, from gpu_health;
- alerts: those open at any moment of the range;
- events: XIDs, ECC, throttling, lost and back, from gpu_events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from .results import Row, dict_rows_async

AsyncConn = psycopg.AsyncConnection[Any]

_RANGE = "gpu_uuid = %(g)s AND {t} >= %(from)s AND {t} < %(to)s"
_MINUTES = (
    "gpu_uuid = %(g)s AND bucket >= public.time_bucket(interval '1 minute', %(from)s) AND bucket < %(to)s"
)

STATEMENTS = {
    "jobs": f"""
        SELECT hostname, cluster, job, pod, namespace,
               min(first_time) AS first_seen, max(last_time) AS last_seen,
               count(DISTINCT bucket) AS minutes, sum(samples) AS samples,
               sum(busy_samples)::float8 / nullif(sum(busy_samples + idle_samples), 0) AS busy_share
          FROM gpu_usage_1min WHERE {_MINUTES}
         GROUP BY hostname, cluster, job, pod, namespace
         ORDER BY first_seen, hostname LIMIT %(limit)s""",
    "classes": f"""
        SELECT classification, username AS user, min(bucket) AS first_minute, max(bucket) AS last_minute,
               count(*) AS minutes
          FROM gpu_work_1min WHERE {_MINUTES}
         GROUP BY classification, username ORDER BY first_minute, classification LIMIT %(limit)s""",
    "processes": f"""
        SELECT pid, start_time, executable, command_line, username AS user, classification, rule, type,
               pod_uid, container_id, min(time) AS first_seen, max(time) AS last_seen, count(*) AS polls,
               max(used_memory_mib) AS max_used_memory_mib
          FROM gpu_processes WHERE {_RANGE.format(t="time")}
         GROUP BY pid, start_time, executable, command_line, username, classification, rule, type,
                  pod_uid, container_id
         ORDER BY first_seen, pid LIMIT %(limit)s""",
    "verdicts": """
        SELECT time, subsystem, state, rule, evidence, time < %(from)s AS before
          FROM gpu_health h
         WHERE gpu_uuid = %(g)s AND time < %(to)s
           AND (time >= %(from)s OR time = (SELECT max(time) FROM gpu_health p WHERE p.gpu_uuid = h.gpu_uuid
                                             AND p.subsystem = h.subsystem AND p.time < %(from)s))
         ORDER BY time, subsystem LIMIT %(limit)s""",
    "alerts": """
        SELECT id, kind, severity, state, summary, evidence, opened_at, resolved_at, acknowledged_at,
               acknowledged_by
          FROM gpu_alerts
         WHERE gpu_uuid = %(g)s AND opened_at < %(to)s AND (resolved_at IS NULL OR resolved_at >= %(from)s)
         ORDER BY opened_at, id LIMIT %(limit)s""",
    "events": f"""
        SELECT time, kind, hostname, details FROM gpu_events WHERE {_RANGE.format(t="time")}
         ORDER BY time, kind LIMIT %(limit)s""",
}


async def gpu_timeline(
    conn: AsyncConn, gpu_uuid: str, *, start: datetime, end: datetime, limit: int
) -> dict[str, list[Row]]:
    """Each of STATEMENTS' lists for the GPU in [start, end), at most `limit` + 1 rows each."""
    params = {"g": gpu_uuid, "from": start, "to": end, "limit": limit + 1}
    return {name: await dict_rows_async(conn, statement, params) for name, statement in STATEMENTS.items()}

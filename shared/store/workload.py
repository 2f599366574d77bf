"""gpu_processes, gpu_process_polls, gpu_process_latest, gpu_work_1min, llm_sessions, llm_server_status.

The sink stores each message once: every insert is ON CONFLICT DO NOTHING on
the table's idempotency key, so a replay adds nothing, and a GPU's latest
listing never moves back in time. Old chunks are dropped per table
(`drop_old_chunks`, drop_chunks works under either TimescaleDB license). The
API's reads take an async connection whose rows are dicts (dict_row); a GPU's
processes are those of its newest poll, and LLM figures are percentiles over
a window, computed in the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from .errors import translated
from .results import Row

Cursor = psycopg.Cursor[Any]
AsyncConn = psycopg.AsyncConnection[Any]

PROCESS_COLUMNS = (
    "time", "gpu_uuid", "pid", "hostname", "type", "used_memory_mib", "sm_util_pct", "mem_util_pct",
    "executable", "command_line", "username", "start_time", "container_id", "pod_uid", "qos_class",
    "classification", "rule", "launcher", "job_key", "rank", "local_rank", "world_size", "launch_note",
)  # fmt: skip
POLL_COLUMNS = ("time", "gpu_uuid", "gpu_index", "hostname", "collector_id", "source", "process_count")
SESSION_COLUMNS = (
    "time", "request_id", "source", "monitor_id", "server", "engine", "endpoint", "model", "streamed",
    "http_status", "ok", "error", "prompt_tokens", "completion_tokens", "load_ms", "prompt_eval_ms",
    "eval_ms", "total_ms", "ttft_ms", "wall_ms", "tokens_per_s", "tpot_ms",
)  # fmt: skip
SERVER_COLUMNS = (
    "time",
    "server",
    "engine",
    "monitor_id",
    "up",
    "version",
    "models",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage_ratio",
    "ttft_ms",
    "tpot_ms",
    "prompt_tokens",
    "completion_tokens",
)
# Days kept per table: process listings are operational detail; LLM figures feed capacity planning.
# The usage rollups (schema/0050) are kept a year, as gpu_metrics_1min.
KEEP_DAYS = {
    "gpu_processes": 30,
    "gpu_process_polls": 30,
    "llm_sessions": 90,
    "llm_server_status": 90,
    "gpu_work_1min": 365,
    "gpu_usage_1min": 365,
}


def _insert(table: str, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )


_INSERT_PROCESS = _insert("gpu_processes", PROCESS_COLUMNS)
_INSERT_POLL = _insert("gpu_process_polls", POLL_COLUMNS)
_INSERT_SESSION = _insert("llm_sessions", SESSION_COLUMNS)
_INSERT_SERVER = _insert("llm_server_status", SERVER_COLUMNS)
_UPSERT_LATEST = (
    "INSERT INTO gpu_process_latest (gpu_uuid, time, gpu_index, hostname, process_count)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (gpu_uuid) DO UPDATE SET time = EXCLUDED.time,"
    " gpu_index = EXCLUDED.gpu_index, hostname = EXCLUDED.hostname, process_count = EXCLUDED.process_count"
    " WHERE EXCLUDED.time > gpu_process_latest.time"
)
# A new poll's shares of its minute (schema/0050): 1/n to each of its n processes' class and user,
# 1 to class 'none' for a poll with no process.
_ADD_WORK = (
    "INSERT INTO gpu_work_1min (bucket, gpu_uuid, classification, username, polls)"
    " SELECT public.time_bucket(interval '1 minute', %(t)s::timestamptz), %(g)s, w.c, w.u,"
    " count(*)::float8 / %(n)s FROM unnest(%(c)s::text[], %(u)s::text[]) AS w(c, u) GROUP BY w.c, w.u"
    " ON CONFLICT (gpu_uuid, bucket, classification, username)"
    " DO UPDATE SET polls = gpu_work_1min.polls + EXCLUDED.polls"
)
_CLASS, _USER = PROCESS_COLUMNS.index("classification"), PROCESS_COLUMNS.index("username")


def insert_process_poll(cur: Cursor, poll: tuple[Any, ...], processes: Sequence[tuple[Any, ...]]) -> int:
    """One GPU's process listing: the poll (POLL_COLUMNS), its GPU's latest, its processes
    (PROCESS_COLUMNS each) and, if the poll is new, its shares of the minute in gpu_work_1min.
    1 if the poll was new, 0 if stored before."""
    with translated(cur.connection):
        cur.execute(_INSERT_POLL, poll)
        inserted = max(cur.rowcount, 0)
        time, gpu_uuid, gpu_index, hostname, _, _, count = poll
        cur.execute(_UPSERT_LATEST, (gpu_uuid, time, gpu_index, hostname, count))
        if processes:
            cur.executemany(_INSERT_PROCESS, processes)
        if inserted:
            classes = [p[_CLASS] for p in processes] or ["none"]
            users = [p[_USER] for p in processes] or [None]
            cur.execute(_ADD_WORK, {"t": time, "g": gpu_uuid, "n": len(classes), "c": classes, "u": users})
    return inserted


def insert_session(cur: Cursor, row: tuple[Any, ...]) -> int:
    """One LLM request (SESSION_COLUMNS); 1 if new."""
    with translated(cur.connection):
        cur.execute(_INSERT_SESSION, row)
        return max(cur.rowcount, 0)


def insert_server_status(cur: Cursor, row: tuple[Any, ...]) -> int:
    """One LLM server snapshot (SERVER_COLUMNS); 1 if new."""
    with translated(cur.connection):
        cur.execute(_INSERT_SERVER, row)
        return max(cur.rowcount, 0)


def drop_old_chunks(conn: psycopg.Connection[Any], keep_days: Mapping[str, int]) -> dict[str, int]:
    """drop_chunks on each table older than its days (committed); the chunks dropped per table."""
    dropped = {}
    with translated(conn):
        for table, days in keep_days.items():
            rows = conn.execute(
                "SELECT public.drop_chunks(%s::regclass, older_than => now() - make_interval(days => %s))",
                (table, days),
            ).fetchall()
            dropped[table] = len(rows)
        conn.commit()
    return dropped


# ---------------------------------------------------------------- the API's reads
_PROCESS_FIELDS = (
    "p.pid, p.type, p.used_memory_mib, p.sm_util_pct, p.mem_util_pct, p.executable, p.command_line,"
    " p.username AS user, p.start_time, p.container_id, p.pod_uid, p.qos_class, p.classification, p.rule,"
    " p.launcher, p.job_key, p.rank, p.local_rank, p.world_size, p.launch_note"
)
_HOST = "WHERE (%(h)s::text IS NULL OR l.hostname = %(h)s)"
_CURRENT = (
    "FROM gpu_process_latest l JOIN gpu_processes p ON p.gpu_uuid = l.gpu_uuid AND p.time = l.time " + _HOST
)


async def _fetch(conn: AsyncConn, query: str, params: dict[str, Any]) -> list[Row]:
    with translated(conn):
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def process_listing(conn: AsyncConn, gpu_uuid: str) -> Row | None:
    """The GPU's newest poll (None: never listed)."""
    found = await _fetch(conn, "SELECT * FROM gpu_process_latest WHERE gpu_uuid = %(g)s", {"g": gpu_uuid})
    return found[0] if found else None


async def processes_at(conn: AsyncConn, gpu_uuid: str, time: datetime) -> list[Row]:
    """The GPU's processes of the poll at `time`, the biggest in memory first."""
    return await _fetch(
        conn,
        f"SELECT {_PROCESS_FIELDS} FROM gpu_processes p WHERE p.gpu_uuid = %(g)s AND p.time = %(t)s"
        " ORDER BY p.used_memory_mib DESC NULLS LAST, p.pid",
        {"g": gpu_uuid, "t": time},
    )


async def fleet_work(conn: AsyncConn, hostname: str | None) -> Row:
    """GPUs listed and busy, processes, the newest poll (of one host, if given)."""
    found = await _fetch(
        conn,
        f"""
        SELECT count(*) AS gpus_listed, count(*) FILTER (WHERE l.process_count > 0) AS gpus_busy,
               coalesce(sum(l.process_count), 0) AS processes, max(l.time) AS newest_poll
          FROM gpu_process_latest l {_HOST}""",
        {"h": hostname},
    )
    return found[0]


async def work_by_class(conn: AsyncConn, hostname: str | None) -> list[Row]:
    """Current processes by classification: processes, GPUs, memory, pods."""
    return await _fetch(
        conn,
        f"""
        SELECT p.classification, count(*) AS processes, count(DISTINCT p.gpu_uuid) AS gpus,
               coalesce(sum(p.used_memory_mib), 0) AS used_memory_mib, count(DISTINCT p.pod_uid) AS pods
          {_CURRENT} GROUP BY p.classification ORDER BY processes DESC, p.classification""",
        {"h": hostname},
    )


async def work_by_rule(conn: AsyncConn, hostname: str | None) -> list[Row]:
    """Current processes by the rule that classified them."""
    return await _fetch(
        conn,
        f"""
        SELECT p.rule, p.classification, count(*) AS processes
          {_CURRENT} GROUP BY p.rule, p.classification ORDER BY processes DESC, p.rule""",
        {"h": hostname},
    )


async def llm_models(conn: AsyncConn, start: datetime, end: datetime) -> list[Row]:
    """Per model in [start, end): requests, errors, TTFT/TPS/TPOT percentiles, tokens."""
    return await _fetch(
        conn,
        """
        SELECT model, count(*) AS requests, count(*) FILTER (WHERE NOT ok) AS errors,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p50_ms,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p95_ms,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY tokens_per_s) AS tps_p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY tokens_per_s) AS tps_p95,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY tpot_ms) AS tpot_p50_ms,
               coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
               coalesce(sum(completion_tokens), 0) AS completion_tokens
          FROM llm_sessions WHERE time >= %(s)s AND time < %(e)s
         GROUP BY model ORDER BY requests DESC, model""",
        {"s": start, "e": end},
    )


async def llm_timeline(
    conn: AsyncConn, start: datetime, end: datetime, step: timedelta, *, model: str | None, server: str | None
) -> list[Row]:
    """Per period of `step` (UTC-aligned), model and server in [start, end): requests, errors, tokens in
    and out, TTFT and TPOT p50/p95/p99, tokens/s p50 and p5 (the slow tail); oldest first."""
    return await _fetch(
        conn,
        """
        SELECT public.time_bucket(%(step)s, time) AS period, model, server,
               count(*) AS requests, count(*) FILTER (WHERE NOT ok) AS errors,
               coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
               coalesce(sum(completion_tokens), 0) AS completion_tokens,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p50_ms,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p95_ms,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY ttft_ms) AS ttft_p99_ms,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY tpot_ms) AS tpot_p50_ms,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY tpot_ms) AS tpot_p95_ms,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY tpot_ms) AS tpot_p99_ms,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY tokens_per_s) AS tps_p50,
               percentile_cont(0.05) WITHIN GROUP (ORDER BY tokens_per_s) AS tps_p5
          FROM llm_sessions
         WHERE time >= %(s)s AND time < %(e)s
           AND (%(m)s::text IS NULL OR model = %(m)s) AND (%(v)s::text IS NULL OR server = %(v)s)
         GROUP BY period, model, server ORDER BY period, model, server""",
        {"s": start, "e": end, "step": step, "m": model, "v": server},
    )


async def llm_servers(conn: AsyncConn) -> list[Row]:
    """Each LLM server's newest snapshot of the last day."""
    return await _fetch(
        conn,
        """
        SELECT DISTINCT ON (server) server, time, engine, up, version, models, requests_running,
               requests_waiting, kv_cache_usage_ratio, ttft_ms, tpot_ms
          FROM llm_server_status WHERE time > now() - interval '1 day'
         ORDER BY server, time DESC""",
        {},
    )

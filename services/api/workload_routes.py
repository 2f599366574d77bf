"""REST endpoints for workload telemetry: processes per GPU and per fleet, LLM serving per model and server.

A GPU's processes are those of its newest poll (gpu_process_latest), so a GPU
whose jobs ended shows none rather than the last ones it had. LLM figures are
percentiles over the requested window (default: the last hour), computed in
the database with percentile_cont.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from .routes import LABEL, GpuPath, only, rows, time_range

router = APIRouter(prefix="/api/v1")

_PROCESS_COLUMNS = (
    "p.pid, p.type, p.used_memory_mib, p.sm_util_pct, p.mem_util_pct, p.executable, p.command_line,"
    " p.username AS user, p.start_time, p.container_id, p.pod_uid, p.qos_class, p.classification, p.rule"
)


@router.get("/gpus/{gpu_uuid}/processes", dependencies=[only()])
async def gpu_processes(request: Request, gpu_uuid: GpuPath) -> dict[str, Any]:
    """What runs on one GPU now: its newest process poll, each process with its class and rule."""
    latest = await rows(request, "SELECT * FROM gpu_process_latest WHERE gpu_uuid = %(g)s", {"g": gpu_uuid})
    if not latest:
        raise HTTPException(404, f"no process listing for GPU {gpu_uuid}")
    head = latest[0]
    processes = await rows(
        request,
        f"SELECT {_PROCESS_COLUMNS} FROM gpu_processes p WHERE p.gpu_uuid = %(g)s AND p.time = %(t)s"
        " ORDER BY p.used_memory_mib DESC NULLS LAST, p.pid",
        {"g": gpu_uuid, "t": head["time"]},
    )
    return {**head, "processes": processes}


@router.get("/fleet/processes", dependencies=[only("hostname")])
async def fleet_processes(
    request: Request, hostname: Annotated[str | None, Query(pattern=LABEL, max_length=253)] = None
) -> dict[str, Any]:
    """The fleet's GPU work now, by class and by rule: processes, GPUs, memory, pods."""
    params = {"h": hostname}
    where = "WHERE (%(h)s::text IS NULL OR l.hostname = %(h)s)"
    gpus = (
        await rows(
            request,
            f"""
        SELECT count(*) AS gpus_listed, count(*) FILTER (WHERE l.process_count > 0) AS gpus_busy,
               coalesce(sum(l.process_count), 0) AS processes, max(l.time) AS newest_poll
          FROM gpu_process_latest l {where}""",
            params,
        )
    )[0]
    current = (
        "FROM gpu_process_latest l JOIN gpu_processes p ON p.gpu_uuid = l.gpu_uuid AND p.time = l.time "
        + where
    )
    by_class = await rows(
        request,
        f"""
        SELECT p.classification, count(*) AS processes, count(DISTINCT p.gpu_uuid) AS gpus,
               coalesce(sum(p.used_memory_mib), 0) AS used_memory_mib, count(DISTINCT p.pod_uid) AS pods
          {current} GROUP BY p.classification ORDER BY processes DESC, p.classification""",
        params,
    )
    by_rule = await rows(
        request,
        f"""
        SELECT p.rule, p.classification, count(*) AS processes
          {current} GROUP BY p.rule, p.classification ORDER BY processes DESC, p.rule""",
        params,
    )
    return {**gpus, "by_class": by_class, "by_rule": by_rule}


@router.get("/llm/models", dependencies=[only("from", "to")])
async def llm_models(
    request: Request,
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None,
) -> dict[str, Any]:
    """Per model: requests, errors, p50/p95 time to first token and tokens/s, p50 time per output token."""
    start, end = time_range(request, start, end, timedelta(hours=1))
    models = await rows(
        request,
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
    return {"from": start, "to": end, "models": models}


@router.get("/llm/servers", dependencies=[only()])
async def llm_servers(request: Request) -> dict[str, Any]:
    """Each LLM server's newest snapshot in the last day: up, version, loaded models with size and VRAM."""
    servers = await rows(
        request,
        """
        SELECT DISTINCT ON (server) server, time, engine, up, version, models, requests_running,
               requests_waiting, kv_cache_usage_ratio, ttft_ms, tpot_ms
          FROM llm_server_status WHERE time > now() - interval '1 day'
         ORDER BY server, time DESC""",
        {},
    )
    return {"servers": servers}

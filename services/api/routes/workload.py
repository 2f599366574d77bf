"""Workload telemetry: processes per GPU and across the fleet, LLM serving per model and per server.

A GPU's processes are those of its newest poll (gpu_process_latest), so a GPU
whose jobs ended shows none rather than the last ones it had. LLM figures are
percentiles over the requested window (default: the last hour), computed in
the database with percentile_cont.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from shared.store import workload

from ..answers import problems
from ..answers.workload import FleetWork, GpuProcesses, LlmModels, LlmServers
from ..deps import Db, Settings
from ..parameters import FleetProcessesQuery, GpuPath, NoQuery, WindowQuery

router = APIRouter(tags=["workload"])


@router.get("/gpus/{gpu_uuid}/processes", responses=problems({404: "the GPU's processes were never listed"}))
async def gpu_processes(db: Db, gpu_uuid: GpuPath, query: Annotated[NoQuery, Query()]) -> GpuProcesses:
    """What runs on one GPU now: its newest process poll, each process with its class and rule."""
    async with db.reading() as conn:
        head = await workload.process_listing(conn, gpu_uuid)
        if head is None:
            raise HTTPException(404, f"no process listing for GPU {gpu_uuid}")
        processes = await workload.processes_at(conn, gpu_uuid, head["time"])
    return GpuProcesses.model_validate({**head, "processes": processes})


@router.get("/fleet/processes")
async def fleet_processes(db: Db, query: Annotated[FleetProcessesQuery, Query()]) -> FleetWork:
    """The fleet's GPU work now, by class and by rule: processes, GPUs, memory, pods."""
    async with db.reading() as conn:
        gpus = await workload.fleet_work(conn, query.hostname)
        by_class = await workload.work_by_class(conn, query.hostname)
        by_rule = await workload.work_by_rule(conn, query.hostname)
    return FleetWork.model_validate({**gpus, "by_class": by_class, "by_rule": by_rule})


@router.get("/llm/models")
async def llm_models(db: Db, limits: Settings, query: Annotated[WindowQuery, Query()]) -> LlmModels:
    """Per model: requests, errors, p50/p95 time to first token and tokens/s, p50 time per output token."""
    start, end = query.span(default=timedelta(hours=1), max_days=limits.max_range_days)
    async with db.reading() as conn:
        models = await workload.llm_models(conn, start, end)
    return LlmModels.model_validate({"from": start, "to": end, "models": models})


@router.get("/llm/servers")
async def llm_servers(db: Db, query: Annotated[NoQuery, Query()]) -> LlmServers:
    """Each LLM server's newest snapshot in the last day: up, version, loaded models with size and VRAM."""
    async with db.reading() as conn:
        servers = await workload.llm_servers(conn)
    return LlmServers.model_validate({"servers": servers})

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

from shared.store import workload

from .paging import wire
from .routes import LABEL, GpuPath, connection, only, time_range

router = APIRouter(prefix="/api/v1")


@router.get("/gpus/{gpu_uuid}/processes", dependencies=[only()])
async def gpu_processes(request: Request, gpu_uuid: GpuPath) -> dict[str, Any]:
    """What runs on one GPU now: its newest process poll, each process with its class and rule."""
    async with connection(request.app.state.pool) as conn:
        head = await workload.process_listing(conn, gpu_uuid)
        if head is None:
            raise HTTPException(404, f"no process listing for GPU {gpu_uuid}")
        processes = await workload.processes_at(conn, gpu_uuid, head["time"])
    return {**wire(head), "processes": wire(processes)}


@router.get("/fleet/processes", dependencies=[only("hostname")])
async def fleet_processes(
    request: Request, hostname: Annotated[str | None, Query(pattern=LABEL, max_length=253)] = None
) -> dict[str, Any]:
    """The fleet's GPU work now, by class and by rule: processes, GPUs, memory, pods."""
    async with connection(request.app.state.pool) as conn:
        gpus = await workload.fleet_work(conn, hostname)
        by_class = await workload.work_by_class(conn, hostname)
        by_rule = await workload.work_by_rule(conn, hostname)
    return {**wire(gpus), "by_class": wire(by_class), "by_rule": wire(by_rule)}


@router.get("/llm/models", dependencies=[only("from", "to")])
async def llm_models(
    request: Request,
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None,
) -> dict[str, Any]:
    """Per model: requests, errors, p50/p95 time to first token and tokens/s, p50 time per output token."""
    start, end = time_range(request, start, end, timedelta(hours=1))
    async with connection(request.app.state.pool) as conn:
        models = await workload.llm_models(conn, start, end)
    return {"from": start, "to": end, "models": wire(models)}


@router.get("/llm/servers", dependencies=[only()])
async def llm_servers(request: Request) -> dict[str, Any]:
    """Each LLM server's newest snapshot in the last day: up, version, loaded models with size and VRAM."""
    async with connection(request.app.state.pool) as conn:
        servers = await workload.llm_servers(conn)
    return {"servers": wire(servers)}

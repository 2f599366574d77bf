"""The workload's answers: processes per GPU and per fleet, LLM serving per model and server."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from shared.contract.models_workload import ProcessClass

from . import Answer, ApiTime, StoredList


class GpuProcess(Answer):
    pid: int
    type: Literal["compute", "graphics", "compute+graphics"]
    used_memory_mib: int | None
    sm_util_pct: float | None
    mem_util_pct: float | None
    executable: str | None
    command_line: str | None
    user: str | None
    start_time: ApiTime | None
    container_id: str | None
    pod_uid: str | None
    qos_class: str | None
    classification: ProcessClass
    rule: str
    launcher: str | None = None  # torchrun, deepspeed, accelerate: the launcher that started it
    job_key: str | None = None  # what the GPUs of its job share: elastic:<run id>, master:<addr>:<port>
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    launch_note: str | None = None  # why the launch is not known (environ unreadable, malformed)


class GpuProcesses(Answer):
    """A GPU's newest process poll and its processes, the biggest in memory first."""

    gpu_uuid: str
    time: ApiTime
    gpu_index: int
    hostname: str
    process_count: int
    processes: list[GpuProcess]


class WorkByClass(Answer):
    classification: ProcessClass
    processes: int
    gpus: int
    used_memory_mib: int  # a sum of bigints: numeric in PostgreSQL, a Decimal in the row
    pods: int


class WorkByRule(Answer):
    rule: str
    classification: ProcessClass
    processes: int


class FleetWork(Answer):
    gpus_listed: int
    gpus_busy: int
    processes: int
    newest_poll: ApiTime | None
    by_class: list[WorkByClass]
    by_rule: list[WorkByRule]


class LlmModelFigures(Answer):
    model: str
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tps_p50: float | None
    tps_p95: float | None
    tpot_p50_ms: float | None
    prompt_tokens: int
    completion_tokens: int


class LlmModels(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from")
    end: ApiTime = Field(alias="to")
    models: list[LlmModelFigures]


class LlmServer(Answer):
    server: str
    time: ApiTime
    engine: str
    up: bool
    version: str | None
    models: StoredList
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_usage_ratio: float | None
    ttft_ms: float | None
    tpot_ms: float | None


class LlmServers(Answer):
    servers: list[LlmServer]

"""Workload messages: `GpuProcesses` (gpu-processes) and `LlmSession` / `LlmServerStatus` (llm-sessions).

A `GpuProcesses` message is one GPU's process list at one poll, keyed by the
GPU's UUID; an empty list says the GPU ran nothing then. Every process carries
its classification and the name of the rule (config/process-rules.toml) that
decided it. `llm-sessions` carries two kinds told apart by `kind`: one
`session` per request seen by the Ollama proxy (or the synthetic probe), and a
`server` snapshot of what an Ollama or vLLM server has loaded and reports.
Times are UTC with a `Z`, like every other topic.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from gpuhealth.contract.base import (
    GpuUuid,
    Label,
    Pct,
    StrictModel,
    TopicMessage,
    UtcTime,
    parse_message,
)
from shared.plumbing.errors import ContractError

# No NUL (PostgreSQL text cannot hold it; a pattern also refuses lone surrogates)
Text = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]
Ms = Annotated[float, Field(ge=0, le=86_400_000)]
Tokens = Annotated[int, Field(ge=0, le=10_000_000_000)]
Bytes = Annotated[int, Field(ge=0, le=2**53)]
HexId = Annotated[str, Field(pattern=r"^[0-9a-f]{12,64}$")]
PodUid = Annotated[str, Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]


class ProcessClass(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    LLM_SERVING = "llm_serving"
    GAMING = "gaming"
    COMPUTE = "compute"


class GpuProcess(StrictModel):
    """One process on one GPU: what NVML says of it, what /proc says of it, and what kind of work it is."""

    pid: int = Field(ge=1, le=2**31)
    type: Literal["compute", "graphics", "compute+graphics"]
    used_memory_mib: Annotated[int | None, Field(ge=0, le=100_000_000)] = None
    sm_util_pct: Pct = None
    mem_util_pct: Pct = None
    executable: Text | None = None
    command_line: Text | None = None
    user: Label | None = None
    start_time: UtcTime | None = None
    container_id: HexId | None = None
    pod_uid: PodUid | None = None
    qos_class: Literal["guaranteed", "burstable", "besteffort"] | None = None
    classification: ProcessClass
    rule: Label
    # A launched worker's job (services/collector/launcher.py): its launcher, the job key the GPUs
    # of one job share (elastic run id, else master address and port), its ranks; launch_note says
    # why it is not known where /proc refused the environment or the variables were malformed.
    launcher: Literal["torchrun", "deepspeed", "accelerate"] | None = None
    job_key: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")] | None = None
    rank: Annotated[int, Field(ge=0, le=999_999)] | None = None
    local_rank: Annotated[int, Field(ge=0, le=65535)] | None = None
    world_size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    launch_note: Annotated[str, Field(max_length=500, pattern=r"^[^\x00]*$")] | None = None


class GpuProcesses(TopicMessage):
    time: UtcTime
    source: Literal["nvml", "mock"]
    collector_id: Label
    hostname: Label
    gpu_uuid: GpuUuid
    gpu_index: int = Field(ge=0, le=4096)
    processes: list[GpuProcess] = Field(default_factory=list, max_length=1024)


class LlmSession(TopicMessage):
    """One request to an LLM server, as the proxy or the probe saw it; durations in milliseconds."""

    kind: Literal["session"] = "session"
    request_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]  # the idempotency key with `time`
    time: UtcTime  # when the request arrived
    source: Literal["proxy", "probe"]
    monitor_id: Label
    server: Label
    engine: Literal["ollama"] = "ollama"
    endpoint: Literal["/api/generate", "/api/chat"]
    model: Label
    streamed: bool
    http_status: int = Field(ge=100, le=599)
    ok: bool
    error: Annotated[str, Field(max_length=500, pattern=r"^[^\x00]*$")] | None = None
    prompt_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None
    load_ms: Ms | None = None
    prompt_eval_ms: Ms | None = None
    eval_ms: Ms | None = None
    total_ms: Ms | None = None
    ttft_ms: Ms | None = None  # client side: request sent -> first token received
    wall_ms: Ms
    tokens_per_s: Annotated[float, Field(ge=0, le=10_000_000)] | None = None
    tpot_ms: Ms | None = None


class LoadedModel(StrictModel):
    name: Label
    size_bytes: Bytes | None = None
    vram_bytes: Bytes | None = None
    expires_at: UtcTime | None = None


class LlmServerStatus(TopicMessage):
    """One LLM server at one poll: version and loaded models (Ollama), or its counters (vLLM)."""

    kind: Literal["server"] = "server"
    time: UtcTime
    monitor_id: Label
    server: Label
    engine: Literal["ollama", "vllm"]
    up: bool
    version: Label | None = None
    models: list[LoadedModel] = Field(default_factory=list, max_length=256)
    requests_running: Annotated[float, Field(ge=0, le=1e9)] | None = None
    requests_waiting: Annotated[float, Field(ge=0, le=1e9)] | None = None
    kv_cache_usage_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    # vLLM histograms over the last poll interval: mean of the requests that finished in it.
    ttft_ms: Ms | None = None
    tpot_ms: Ms | None = None
    prompt_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None


def parse_gpu_processes(raw: bytes | str) -> GpuProcesses:
    """Validate one gpu-processes message; ContractError says why it is refused."""
    return parse_message(GpuProcesses, raw)


def parse_llm_message(raw: bytes | str) -> LlmSession | LlmServerStatus:
    """Validate one llm-sessions message of either kind; ContractError says why it is refused."""
    try:
        head = json.loads(raw)
    except ValueError as e:
        raise ContractError(f"value is not JSON: {e}") from e
    kind = head.get("kind") if isinstance(head, dict) else None
    if kind == "session":
        return parse_message(LlmSession, raw)
    if kind == "server":
        return parse_message(LlmServerStatus, raw)
    raise ContractError(f"unknown llm-sessions kind {kind!r}")

"""Usage's answers: GPU-hours and their shares by a dimension, with totals; what ran on one GPU and when."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from shared.contract.models_health import AlertSeverity, AlertState, HealthState
from shared.contract.models_workload import ProcessClass

from . import Answer, ApiTime, StoredObject

Hours = Annotated[float, Field(ge=0)]
Share = Annotated[float | None, Field(ge=0, le=1, description="of gpu_hours; null when there are none")]


class UsageFigures(Answer):
    """What a group (or all of them) used in the window.

    A GPU's time counts while it reported (a GPU that stopped reporting counts nothing); busy is
    utilisation of 1 % or more, idle-while-allocated is idle time with a job, pod or namespace label
    or a process on the GPU. Energy is the GPU's energy counter's increase (null: no GPU of the
    group reported one)."""

    gpus: int = Field(description="distinct GPUs that contributed")
    gpu_hours: Hours
    busy_hours: Hours
    busy_share: Share
    idle_allocated_hours: Hours
    idle_allocated_share: Share
    avg_util_pct: float | None = Field(description="utilisation averaged over the time it was reported")
    energy_kwh: float | None


class UsageGroup(UsageFigures):
    key: str | None = Field(description="the group's value of `by`; null: samples without that label")


class Usage(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from", description="the window's start, whole minutes")
    end: ApiTime = Field(alias="to", description="the window's end (exclusive), whole minutes")
    by: str
    groups: list[UsageGroup] = Field(description="the most GPU-hours first")
    total: UsageFigures = Field(description="every group the filters keep")


class UsagePeriod(Answer):
    period: ApiTime = Field(description="the period's start (UTC-aligned)")
    total: UsageFigures
    groups: list[UsageGroup]


class UsageTimeline(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from")
    end: ApiTime = Field(alias="to")
    by: str
    step: str
    periods: list[UsagePeriod] = Field(description="the periods with any usage, oldest first")


class JobOnGpu(Answer):
    """A label set the GPU's samples carried: one job, pod or namespace on one host."""

    hostname: str
    cluster: str | None
    job: str | None
    pod: str | None
    namespace: str | None
    first_seen: ApiTime
    last_seen: ApiTime
    minutes: int = Field(description="minutes with a sample carrying these labels")
    samples: int
    busy_share: float | None = Field(description="of its samples with a utilisation, those at 1 % or more")


class ClassOnGpu(Answer):
    classification: str = Field(description="a process class, or `none`: listed with no process")
    user: str | None
    first_minute: ApiTime
    last_minute: ApiTime
    minutes: int = Field(description="minutes with a process listing that had it")


class ProcessOnGpu(Answer):
    pid: int
    start_time: ApiTime | None
    executable: str | None
    command_line: str | None
    user: str | None
    classification: ProcessClass
    rule: str
    type: Literal["compute", "graphics", "compute+graphics"]
    pod_uid: str | None
    container_id: str | None
    first_seen: ApiTime
    last_seen: ApiTime
    polls: int
    max_used_memory_mib: int | None


class VerdictOnGpu(Answer):
    time: ApiTime
    subsystem: str
    state: HealthState
    rule: str | None
    evidence: StoredObject
    before: bool = Field(description="the verdict in force when the range began (given before it)")


class AlertOnGpu(Answer):
    id: int
    kind: str
    severity: AlertSeverity
    state: AlertState
    summary: str
    evidence: StoredObject
    opened_at: ApiTime
    resolved_at: ApiTime | None
    acknowledged_at: ApiTime | None
    acknowledged_by: str | None


class EventOnGpu(Answer):
    time: ApiTime
    kind: str
    hostname: str
    details: StoredObject


class GpuTimeline(Answer):
    """What ran on one GPU over a range and what was said of its health then, each list oldest first."""

    model_config = ConfigDict(populate_by_name=True)

    gpu_uuid: str
    start: ApiTime = Field(alias="from")
    end: ApiTime = Field(alias="to")
    jobs: list[JobOnGpu] = Field(description="label sets of its samples (1-minute rollup, kept a year)")
    classes: list[ClassOnGpu] = Field(description="process classes and users by the minute (kept a year)")
    processes: list[ProcessOnGpu] = Field(description="each process listed (raw polls, kept 30 days)")
    verdicts: list[VerdictOnGpu]
    alerts: list[AlertOnGpu] = Field(description="alerts open at any moment of the range")
    events: list[EventOnGpu]
    truncated: list[str] = Field(description="the lists cut at `limit`")


class LlmPeriod(Answer):
    """One model on one server over one period: its requests and how they were served."""

    period: ApiTime = Field(description="the period's start (UTC-aligned)")
    model: str
    server: str
    requests: int
    errors: int = Field(description="requests that did not succeed (HTTP status or a broken stream)")
    prompt_tokens: int = Field(description="tokens in")
    completion_tokens: int = Field(description="tokens out")
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    tpot_p99_ms: float | None
    tps_p50: float | None
    tps_p5: float | None = Field(description="tokens/s that only the slowest 5 % of requests fell below")


class LlmTimeline(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from")
    end: ApiTime = Field(alias="to")
    step: str
    periods: list[LlmPeriod] = Field(description="oldest first; a period without requests is left out")

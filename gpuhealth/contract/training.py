"""The `gpu-alerts` message a training job publishes (source: training), with the job's identity.

It carries the fields of the scorer's alert messages that a consumer keys on
(time, gpu_uuid, kind, severity, state, summary, evidence) plus what the job
saw: the value, the threshold and its unit, and which job, host and rank saw it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from .base import GpuUuid, Label, StrictModel, TopicMessage, UtcTime, parse_message


class AlertKind(StrEnum):
    """The Andon alerts a training job raises (the scorer's thermal, memory_pressure, power_limit; idle)."""

    THERMAL = "thermal"
    MEMORY_PRESSURE = "memory_pressure"
    POWER_LIMIT = "power_limit"
    IDLE = "idle"


Finite = Annotated[float, Field(ge=-1e15, le=1e15)]
Evidence = dict[Label, int | float | str | bool | list[str] | None]


class TrainingJob(StrictModel):
    """Who saw the alert: the job (scheduler id or given), its name, host, process and rank."""

    id: Label
    name: Label | None = None
    hostname: Label
    pid: int = Field(ge=1, le=2**31)
    rank: int | None = Field(default=None, ge=0, le=1_000_000)


class TrainingAlert(TopicMessage):
    time: UtcTime
    source: Literal["training"] = "training"
    gpu_uuid: GpuUuid
    gpu_index: int = Field(ge=0, le=4096)
    kind: AlertKind
    severity: Literal["warning", "critical"]
    state: Literal["open", "resolved"]
    summary: str = Field(min_length=1, max_length=500)
    value: Finite | None
    threshold: Finite
    unit: Label
    job: TrainingJob
    evidence: Evidence = Field(default_factory=dict, max_length=32)


def parse_training_alert(raw: bytes | str) -> TrainingAlert:
    """Validate one training alert from gpu-alerts; ContractError says why it is refused."""
    return parse_message(TrainingAlert, raw)

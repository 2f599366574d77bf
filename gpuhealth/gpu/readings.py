"""What every source hands the collector: one `GpuReading` per GPU per poll."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from gpuhealth.errors import GpuHealthError

MetricValue = int | float | None


class Source(StrEnum):
    """Where a reading came from (a sample's `source` in the gpu-metrics-raw contract)."""

    DCGM = "dcgm"
    NVML = "nvml"
    SMI = "smi"
    MOCK = "mock"


class SourceError(GpuHealthError):
    """A source could not be read this poll (exporter down, NVML failure, nvidia-smi error)."""


@dataclass(slots=True)
class GpuReading:
    uuid: str
    index: int
    model: str
    pci_bus_id: str | None = None
    driver_version: str | None = None
    hostname: str | None = None  # as the source names the host; None: the collector's own
    time: datetime | None = None  # the reading's own timestamp, when the source gives one
    metrics: dict[str, MetricValue] = field(default_factory=dict)  # sample-field name -> value
    workload: dict[str, str] = field(default_factory=dict)  # job, pod, namespace, container
    mig: list[dict[str, object]] = field(default_factory=list)
    # Every XID code the source saw for this GPU since its previous read, in order, repeats
    # included; None where the source cannot enumerate them (then only `xid_last` is known).
    xids: list[int] | None = None
    # dcgm-exporter's count per XID code (DCGM_EXP_XID_ERRORS_COUNT) when the page offers it
    xid_counts: dict[int, int] | None = None


@dataclass(slots=True)
class SourceReading:
    source: Source
    target: str  # the exporter URL, "nvml" or "nvidia-smi": says which node this was
    gpus: list[GpuReading]
    read_at: datetime
    latency_ms: float


class GpuSource(Protocol):
    """A place GPU readings come from; `read` raises SourceError when it cannot answer."""

    kind: Source
    target: str

    def read(self) -> SourceReading: ...

    def close(self) -> None: ...

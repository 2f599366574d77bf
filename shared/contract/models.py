"""The event contract on Kafka: `GpuSample` (gpu-metrics-raw) and `GpuEvent` (gpu-events).

These pydantic models are the single source of truth; the JSON Schemas under
``schema/json/`` are generated from them (``python -m shared.contract.topic_registry``)
and a test keeps the committed files in step. Metric fields carry their unit in
their name and mirror the DCGM field catalogue in :mod:`shared.gpu.dcgm`; a value
the GPU does not report is ``null``, never a sentinel number.

Validation is strict: wrong JSON types, NaN/Infinity, values outside physical
bounds, unknown fields and unknown schema versions are all refused, so the sink
can dead-letter them with a reason instead of storing nonsense.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator

# The contract's building blocks live in the library (the training library's alert is built of
# them too); the services read them here, with the messages they make.
from gpuhealth.contract.base import GPU_UUID_PATTERN as GPU_UUID_PATTERN
from gpuhealth.contract.base import SCHEMA_VERSION as SCHEMA_VERSION
from gpuhealth.contract.base import UNSTATED as UNSTATED
from gpuhealth.contract.base import GpuUuid as GpuUuid
from gpuhealth.contract.base import Label as Label
from gpuhealth.contract.base import (
    Pct,
    StrictModel,
    TopicMessage,
    error_reason,
    parse_message,
    version_required,
)
from gpuhealth.contract.base import UtcTime as UtcTime
from gpuhealth.contract.base import Version as Version
from gpuhealth.contract.base import sane_time as sane_time
from gpuhealth.contract.base import to_json as to_json
from gpuhealth.gpu.readings import Source as Source  # the sample contract's sources
from shared.contract.event_details import DETAILS_BY_KIND
from shared.gpu.dcgm import INT64_BLANK

# Bounds are physical, not typical: they catch broken readings, not hot GPUs.
Temp = Annotated[float | None, Field(ge=-60, le=250)]
Ratio = Annotated[float | None, Field(ge=0, le=1)]
Mhz = Annotated[float | None, Field(ge=0, le=20_000)]
Watts = Annotated[float | None, Field(ge=0, le=10_000)]
Mib = Annotated[int | None, Field(ge=0, le=100_000_000)]
# Below DCGM's int64 sentinels: a "not supported" reading that slipped past a parser is
# refused here rather than stored as a 9.2e18 count.
Count = Annotated[int | None, Field(ge=0, lt=INT64_BLANK)]
Flag = Annotated[int | None, Field(ge=0, le=1)]
Rate = Annotated[int | None, Field(ge=0, le=10**13)]


class MigInstance(StrictModel):
    """One MIG GPU instance's own readings (dcgm-exporter's GPU_I_PROFILE / GPU_I_ID series)."""

    profile: Label
    instance_id: int = Field(ge=0, le=64)
    fb_used_mib: Mib = None
    fb_free_mib: Mib = None
    gpu_util_pct: Pct = None
    # every profiling (DCP) field dcgm-exporter gives per instance, not only the GR engine
    pcie_tx_bytes_per_s: Rate = None
    pcie_rx_bytes_per_s: Rate = None
    prof_gr_engine_active_ratio: Ratio = None
    prof_sm_active_ratio: Ratio = None
    prof_sm_occupancy_ratio: Ratio = None
    prof_tensor_active_ratio: Ratio = None
    prof_dram_active_ratio: Ratio = None


class GpuSample(TopicMessage):
    """One GPU, one poll: identity, placement, workload, and every metric the source reported."""

    time: UtcTime
    source: Source
    collector_id: Label
    collection_latency_ms: float = Field(ge=0, le=3_600_000)
    # identity
    gpu_uuid: GpuUuid
    gpu_index: int = Field(ge=0, le=255)
    model: Label
    pci_bus_id: Label | None = None
    driver_version: Label | None = None
    # placement
    hostname: Label
    cluster: Label | None = None
    datacenter: Label | None = None
    region: Label | None = None
    rack: Label | None = None
    # workload
    job: Label | None = None
    pod: Label | None = None
    namespace: Label | None = None
    container: Label | None = None
    mig: list[MigInstance] = Field(default_factory=list, max_length=64)
    # clocks and temperatures
    sm_clock_mhz: Mhz = None
    mem_clock_mhz: Mhz = None
    gpu_temp_c: Temp = None
    memory_temp_c: Temp = None
    # power
    power_usage_w: Watts = None
    total_energy_mj: Count = None
    # utilisation and memory
    gpu_util_pct: Pct = None
    mem_copy_util_pct: Pct = None
    fb_total_mib: Mib = None
    fb_free_mib: Mib = None
    fb_used_mib: Mib = None
    fb_reserved_mib: Mib = None
    # PCIe
    pcie_tx_bytes_per_s: Rate = None
    pcie_rx_bytes_per_s: Rate = None
    pcie_replay_total: Count = None
    # link generation and lane count, now and at most (a link trained below its max is degraded)
    pcie_link_gen: Annotated[int | None, Field(ge=1, le=16)] = None
    pcie_link_gen_max: Annotated[int | None, Field(ge=1, le=16)] = None
    pcie_link_width: Annotated[int | None, Field(ge=1, le=64)] = None
    pcie_link_width_max: Annotated[int | None, Field(ge=1, le=64)] = None
    # errors, throttling
    xid_last: Annotated[int | None, Field(ge=0, le=100_000)] = None
    clocks_event_reasons: Annotated[int | None, Field(ge=0, le=2**32 - 1)] = None
    power_violation_us: Count = None
    thermal_violation_us: Count = None
    # ECC, retired pages, remapped rows
    ecc_sbe_volatile_total: Count = None
    ecc_dbe_volatile_total: Count = None
    ecc_sbe_aggregate_total: Count = None
    ecc_dbe_aggregate_total: Count = None
    retired_pages_sbe: Count = None
    retired_pages_dbe: Count = None
    retired_pages_pending: Count = None
    remapped_rows_correctable: Count = None
    remapped_rows_uncorrectable: Count = None
    row_remap_failure: Flag = None
    row_remap_pending: Flag = None
    # NVLink
    nvlink_bandwidth_total: Count = None
    nvlink_crc_flit_errors_total: Count = None
    nvlink_crc_data_errors_total: Count = None
    nvlink_replay_errors_total: Count = None
    nvlink_recovery_errors_total: Count = None
    # profiling ratios
    prof_gr_engine_active_ratio: Ratio = None
    prof_sm_active_ratio: Ratio = None
    prof_sm_occupancy_ratio: Ratio = None
    prof_tensor_active_ratio: Ratio = None
    prof_dram_active_ratio: Ratio = None
    # device limits as the GPU reports them
    slowdown_temp_c: Temp = None
    shutdown_temp_c: Temp = None
    power_limit_w: Watts = None
    # what the driver says the GPU needs to recover (NVML's GPU recovery action,
    # gpuhealth.gpu.driver_codes.GpuRecoveryAction: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    # 4 drain and reset); null where the driver does not report it
    gpu_recovery_action: Annotated[int | None, Field(ge=0, le=255)] = None


class EventKind(StrEnum):
    XID = "xid"
    ECC_DBE = "ecc_dbe"
    ROW_REMAP_FAILURE = "row_remap_failure"
    RETIREMENT_PENDING = "retirement_pending"
    THROTTLE_START = "throttle_start"
    THROTTLE_END = "throttle_end"
    GPU_LOST = "gpu_lost"
    GPU_BACK = "gpu_back"


# What a producer hands GpuEvent as `details`; the contract then holds it to its kind's shape.
Details = dict[str, int | float | str | bool | list[str] | None]

_DETAILS_CHECK: dict[EventKind, TypeAdapter[Any]] = {
    EventKind(kind): TypeAdapter(shape) for kind, shape in DETAILS_BY_KIND.items()
}


def _event_schema(schema: dict[str, Any]) -> None:
    """The event's JSON Schema: schema_version required, and the details each kind carries."""
    version_required(schema)
    schema["allOf"] = [
        {
            "if": {"properties": {"kind": {"const": kind.value}}, "required": ["kind"]},
            "then": {"properties": {"details": _DETAILS_CHECK[kind].json_schema()}},
        }
        for kind in _DETAILS_CHECK
    ]


class GpuEvent(TopicMessage):
    """Something that happened between two polls of one GPU."""

    time: UtcTime
    kind: EventKind
    gpu_uuid: GpuUuid
    hostname: Label
    source: Source
    collector_id: Label
    cluster: Label | None = None
    datacenter: Label | None = None
    rack: Label | None = None
    # kind-specific facts, one shape per kind (DETAILS_BY_KIND): the XID code, the DBE increment...
    details: Details = Field(default_factory=dict, max_length=16)

    model_config = ConfigDict(json_schema_extra=_event_schema)

    @model_validator(mode="after")
    def _details_fit_the_kind(self) -> GpuEvent:
        try:
            checked = _DETAILS_CHECK[self.kind].validate_python(self.details, strict=True)
        except ValidationError as e:
            raise ValueError(f"details of a {self.kind.value} event: {error_reason(e)}") from None
        last = checked.get("last") if self.kind is EventKind.XID else None
        if isinstance(last, str) and datetime.fromisoformat(last) < self.time:
            raise ValueError(f"details of an xid event: last ({last}) is before the event's time (its first)")
        if checked != self.details or any(type(checked[k]) is not type(v) for k, v in self.details.items()):
            self.__dict__["details"] = checked  # e.g. a whole number of seconds as the float it is
        return self


METRIC_FIELDS: tuple[str, ...] = tuple(
    name
    for name in GpuSample.model_fields
    if name
    not in {
        "schema_version",
        "time",
        "source",
        "collector_id",
        "collection_latency_ms",
        "gpu_uuid",
        "gpu_index",
        "model",
        "pci_bus_id",
        "driver_version",
        "hostname",
        "cluster",
        "datacenter",
        "region",
        "rack",
        "job",
        "pod",
        "namespace",
        "container",
        "mig",
    }
)


def parse_sample(raw: bytes | str) -> GpuSample:
    """Validate one gpu-metrics-raw message; ContractError says why it is refused."""
    return parse_message(GpuSample, raw)


def parse_event(raw: bytes | str) -> GpuEvent:
    """Validate one gpu-events message; ContractError says why it is refused."""
    return parse_message(GpuEvent, raw)

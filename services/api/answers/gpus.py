"""The GPUs' answers: the list, one GPU in detail."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from shared.contract.models_health import HealthState

from . import Answer, ApiTime, NextCursor, StoredList, StoredObject, Total
from .alerts import AlertRow


def _empty_if_null(value: Any) -> Any:
    return [] if value is None else value


class GpuListed(Answer):
    """One GPU of the list: placement, state, score, latest readings."""

    gpu_uuid: str
    hostname: str
    gpu_index: int
    model: str
    cluster: str | None
    datacenter: str | None
    rack: str | None
    state: HealthState | None = Field(description="null: not scored yet")
    score: float | None
    grade: str | None
    action: str | None
    last_seen: ApiTime | None
    gpu_temp_c: float | None
    power_usage_w: float | None
    gpu_util_pct: float | None


class GpuList(Answer):
    gpus: list[GpuListed]
    total: Total
    limit: int
    offset: int
    next_cursor: NextCursor


class Asset(Answer):
    """The inventory's record of a GPU (gpu_assets)."""

    gpu_uuid: str
    model: str
    gpu_index: int
    pci_bus_id: str | None
    driver_version: str | None
    hostname: str
    cluster: str | None
    datacenter: str | None
    region: str | None
    rack: str | None
    slowdown_temp_c: float | None
    shutdown_temp_c: float | None
    power_limit_w: float | None
    fb_total_mib: int | None
    first_seen: ApiTime
    last_seen: ApiTime


class LatestSample(Answer):
    """A GPU's newest sample (gpu_latest): the contract's fields but its identity, which `asset` holds."""

    time: ApiTime
    gpu_uuid: str
    hostname: str
    cluster: str | None
    datacenter: str | None
    region: str | None
    rack: str | None
    job: str | None
    pod: str | None
    namespace: str | None
    container: str | None
    source: str
    collector_id: str
    collection_latency_ms: float | None
    mig: Annotated[StoredList, BeforeValidator(_empty_if_null)] = Field(description="[]: no MIG instances")
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    gpu_temp_c: float | None
    memory_temp_c: float | None
    power_usage_w: float | None
    total_energy_mj: int | None
    gpu_util_pct: float | None
    mem_copy_util_pct: float | None
    fb_total_mib: int | None
    fb_free_mib: int | None
    fb_used_mib: int | None
    fb_reserved_mib: int | None
    pcie_tx_bytes_per_s: int | None
    pcie_rx_bytes_per_s: int | None
    pcie_replay_total: int | None
    xid_last: int | None
    clocks_event_reasons: int | None
    power_violation_us: int | None
    thermal_violation_us: int | None
    ecc_sbe_volatile_total: int | None
    ecc_dbe_volatile_total: int | None
    ecc_sbe_aggregate_total: int | None
    ecc_dbe_aggregate_total: int | None
    retired_pages_sbe: int | None
    retired_pages_dbe: int | None
    retired_pages_pending: int | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    row_remap_failure: int | None
    row_remap_pending: int | None
    nvlink_bandwidth_total: int | None
    nvlink_crc_flit_errors_total: int | None
    nvlink_crc_data_errors_total: int | None
    nvlink_replay_errors_total: int | None
    nvlink_recovery_errors_total: int | None
    prof_gr_engine_active_ratio: float | None
    prof_sm_active_ratio: float | None
    prof_sm_occupancy_ratio: float | None
    prof_tensor_active_ratio: float | None
    prof_dram_active_ratio: float | None
    slowdown_temp_c: float | None
    shutdown_temp_c: float | None
    power_limit_w: float | None
    pcie_link_gen: int | None
    pcie_link_gen_max: int | None
    pcie_link_width: int | None
    pcie_link_width_max: int | None
    gpu_recovery_action: int | None


class GpuStatus(Answer):
    state: HealthState
    score: float
    grade: str
    action: str
    reasons: StoredList
    as_of: ApiTime


class Verdict(Answer):
    """A subsystem's current verdict, with the evidence that decided it."""

    subsystem: str
    state: HealthState
    rule: str | None
    evidence: StoredObject
    since: ApiTime


class Prediction(Answer):
    time: ApiTime
    p_fail_7d: float
    p_fail_30d: float
    reasons: StoredList


class GpuOpenAlert(AlertRow):
    """One of a GPU's open alerts, with the GPU's host and index."""

    hostname: str
    gpu_index: int


class GpuDetail(Answer):
    """One GPU: identity and placement, latest sample, status, verdicts with evidence, prediction, alerts."""

    asset: Asset
    latest: LatestSample | None = Field(description="null: never sampled")
    status: GpuStatus | None = Field(description="null: never scored")
    verdicts: list[Verdict]
    prediction: Prediction | None
    open_alerts: list[GpuOpenAlert]

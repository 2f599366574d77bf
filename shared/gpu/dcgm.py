"""The DCGM fields gpu-health reads, as dcgm-exporter names them, and DCGM's blank sentinels.

One table serves the mock exporter (what to render) and the collector (how to
parse and where each value goes in a sample). Names follow dcgm-exporter's
``default-counters.csv`` and DCGM's field identifiers; ``sample_field`` is
the key in the ``gpu-metrics-raw`` JSON contract, with the unit in its name.

DCGM reports a value it has not got (blank, not found, not supported, no
permission) as a sentinel just below the top of the field's type. Those must
become ``null``; they must never reach the database as numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

# DCGM's sentinels (dcgm_structs.h): BLANK, then NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED.
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0  # 2**47
INT64_NOT_SUPPORTED = INT64_BLANK + 2
FP64_NOT_SUPPORTED = FP64_BLANK + 2


class ValueKind(StrEnum):
    INT64 = "int64"
    FP64 = "fp64"


class PromType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True, slots=True)
class DcgmField:
    name: str
    prom_type: PromType
    kind: ValueKind
    sample_field: str
    help: str
    aliases: tuple[str, ...] = ()

    def not_supported(self) -> int | float:
        """The sentinel DCGM reports when the device does not support this field."""
        return INT64_NOT_SUPPORTED if self.kind is ValueKind.INT64 else FP64_NOT_SUPPORTED


G, C = PromType.GAUGE, PromType.COUNTER
I64, F64 = ValueKind.INT64, ValueKind.FP64

# fmt: off
# name, Prometheus type, DCGM value type, sample field, help, aliases (older DCGM names)
FIELDS: tuple[DcgmField, ...] = (
    # Clocks
    DcgmField("DCGM_FI_DEV_SM_CLOCK", G, I64, "sm_clock_mhz", "SM clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", G, I64, "mem_clock_mhz", "Memory clock frequency (in MHz)."),
    # Temperature
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", G, I64, "memory_temp_c", "Memory temperature (in C)."),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", G, I64, "gpu_temp_c", "GPU temperature (in C)."),
    # Power
    DcgmField("DCGM_FI_DEV_POWER_USAGE", G, F64, "power_usage_w", "Power draw (in W)."),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", C, I64, "total_energy_mj", "Total energy consumption since boot (in mJ)."),
    # PCIe
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", G, I64, "pcie_tx_bytes_per_s", "PCIe transmit rate (in B/s)."),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", G, I64, "pcie_rx_bytes_per_s", "PCIe receive rate (in B/s)."),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", C, I64, "pcie_replay_total", "Total number of PCIe retries."),
    DcgmField("DCGM_FI_DEV_PCIE_LINK_GEN", G, I64, "pcie_link_gen", "PCIe current link generation."),
    DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", G, I64, "pcie_link_gen_max", "PCIe max link generation."),
    DcgmField("DCGM_FI_DEV_PCIE_LINK_WIDTH", G, I64, "pcie_link_width", "PCIe current link width (lanes)."),
    DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", G, I64, "pcie_link_width_max", "PCIe max link width (lanes)."),
    # Utilization
    DcgmField("DCGM_FI_DEV_GPU_UTIL", G, I64, "gpu_util_pct", "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", G, I64, "mem_copy_util_pct", "Memory utilization (in %)."),
    # Errors and violations
    DcgmField("DCGM_FI_DEV_XID_ERRORS", G, I64, "xid_last", "Value of the last XID error encountered."),
    DcgmField("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", G, I64, "clocks_event_reasons", "Current clock event (throttle) reasons, a bitmask.", aliases=("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",)),
    DcgmField("DCGM_FI_DEV_POWER_VIOLATION", C, I64, "power_violation_us", "Throttling duration due to power constraints (in us)."),
    DcgmField("DCGM_FI_DEV_THERMAL_VIOLATION", C, I64, "thermal_violation_us", "Throttling duration due to thermal constraints (in us)."),
    # Memory usage
    DcgmField("DCGM_FI_DEV_FB_TOTAL", G, I64, "fb_total_mib", "Framebuffer memory total (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_FREE", G, I64, "fb_free_mib", "Framebuffer memory free (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_USED", G, I64, "fb_used_mib", "Framebuffer memory used (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", G, I64, "fb_reserved_mib", "Framebuffer memory reserved (in MiB)."),
    # ECC
    DcgmField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", C, I64, "ecc_sbe_volatile_total", "Total number of single-bit volatile ECC errors."),
    DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", C, I64, "ecc_dbe_volatile_total", "Total number of double-bit volatile ECC errors."),
    DcgmField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", C, I64, "ecc_sbe_aggregate_total", "Total number of single-bit persistent ECC errors."),
    DcgmField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", C, I64, "ecc_dbe_aggregate_total", "Total number of double-bit persistent ECC errors."),
    # Retired pages (pre-Ampere; Ampere and later remap rows instead)
    DcgmField("DCGM_FI_DEV_RETIRED_SBE", C, I64, "retired_pages_sbe", "Total number of retired pages due to single-bit errors."),
    DcgmField("DCGM_FI_DEV_RETIRED_DBE", C, I64, "retired_pages_dbe", "Total number of retired pages due to double-bit errors."),
    DcgmField("DCGM_FI_DEV_RETIRED_PENDING", C, I64, "retired_pages_pending", "Total number of pages pending retirement."),
    # Remapped rows (Ampere and later)
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", C, I64, "remapped_rows_uncorrectable", "Number of remapped rows for uncorrectable errors."),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", C, I64, "remapped_rows_correctable", "Number of remapped rows for correctable errors."),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", G, I64, "row_remap_failure", "Whether remapping of rows has failed."),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", G, I64, "row_remap_pending", "Whether remapping of rows is pending a GPU reset."),
    # NVLink
    DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", C, I64, "nvlink_bandwidth_total", "Total number of NVLink bandwidth counters for all lanes."),
    DcgmField("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", C, I64, "nvlink_crc_flit_errors_total", "Total number of NVLink flow-control CRC errors."),
    DcgmField("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", C, I64, "nvlink_crc_data_errors_total", "Total number of NVLink data CRC errors."),
    DcgmField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", C, I64, "nvlink_replay_errors_total", "Total number of NVLink retries."),
    DcgmField("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", C, I64, "nvlink_recovery_errors_total", "Total number of NVLink recovery errors."),
    # Profiling (DCP) ratios
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", G, F64, "prof_gr_engine_active_ratio", "Ratio of time the graphics engine is active."),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", G, F64, "prof_sm_active_ratio", "Ratio of cycles an SM has at least one warp assigned."),
    DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", G, F64, "prof_sm_occupancy_ratio", "Ratio of resident warps to the maximum an SM supports."),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", G, F64, "prof_tensor_active_ratio", "Ratio of cycles the tensor (HMMA) pipe is active."),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", G, F64, "prof_dram_active_ratio", "Ratio of cycles the device memory interface is active."),
    # Device limits, read from the GPU rather than hard-coded anywhere.
    DcgmField("DCGM_FI_DEV_SLOWDOWN_TEMP", G, I64, "slowdown_temp_c", "Slowdown temperature (in C)."),
    DcgmField("DCGM_FI_DEV_SHUTDOWN_TEMP", G, I64, "shutdown_temp_c", "Shutdown temperature (in C)."),
    DcgmField("DCGM_FI_DEV_POWER_MGMT_LIMIT", G, F64, "power_limit_w", "Power management limit (in W)."),
    # What the driver says the GPU needs to recover (NVML's nvmlDeviceGpuRecoveryAction_t).
    DcgmField("DCGM_FI_DEV_GPU_RECOVERY_ACTION", G, I64, "gpu_recovery_action", "GPU recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).", aliases=("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",)),
)
# fmt: on

BY_NAME: dict[str, DcgmField] = {name: f for f in FIELDS for name in (f.name, *f.aliases)}


def is_blank(value: float, kind: ValueKind) -> bool:
    """True for DCGM's blank/not-found/not-supported/not-permitted sentinels, and NaN."""
    if math.isnan(value):
        return True
    if INT32_BLANK <= value <= INT32_BLANK + 15:
        return True
    if kind is ValueKind.FP64:
        return value >= FP64_BLANK
    # Compared as an exact integer: float(INT64_BLANK) would round up to 2**63 and miss
    # a sentinel parsed as an int, while a float parse (2**63) still compares above it.
    return value >= INT64_BLANK


# dcgm-exporter's per-code XID count (label `xid`): how many of each XID it saw in its
# counting window. DCGM_FI_DEV_XID_ERRORS only holds the latest code.
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"

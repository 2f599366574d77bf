"""GPU models the mock simulates, with the limits and capabilities that make them differ.

Figures are typical values for the SXM parts (power limit, memory, clocks);
slowdown/shutdown temperatures are the usual driver-reported ones. Which
fields a model does not support follows the hardware: Ampere and later remap
rows instead of retiring pages, so they report DCGM's not-supported sentinel for
the retired-page fields; Volta has no row remapping.
"""

from __future__ import annotations

from dataclasses import dataclass

_RETIRED_PAGES = frozenset(
    {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"}
)
_ROW_REMAP = frozenset(
    {
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    }
)


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # the modelName label, as the driver reports it
    memory_mib: int
    reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    slowdown_temp_c: int
    shutdown_temp_c: int
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    mem_clock_mhz: int
    pcie_peak_bytes_per_s: float
    nvlink_peak_bytes_per_s: float
    unsupported: frozenset[str]

    @property
    def page_retirement(self) -> bool:
        return "DCGM_FI_DEV_RETIRED_SBE" not in self.unsupported

    @property
    def row_remapping(self) -> bool:
        return "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in self.unsupported


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="h100-sxm",
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            reserved_mib=579,
            power_limit_w=700.0,
            idle_power_w=72.0,
            slowdown_temp_c=87,
            shutdown_temp_c=92,
            max_sm_clock_mhz=1980,
            idle_sm_clock_mhz=345,
            mem_clock_mhz=2619,
            pcie_peak_bytes_per_s=50e9,
            nvlink_peak_bytes_per_s=450e9,
            unsupported=_RETIRED_PAGES,
        ),
        GpuModel(
            key="a100-sxm4-80gb",
            name="NVIDIA A100-SXM4-80GB",
            memory_mib=81920,
            reserved_mib=506,
            power_limit_w=400.0,
            idle_power_w=62.0,
            slowdown_temp_c=89,
            shutdown_temp_c=92,
            max_sm_clock_mhz=1410,
            idle_sm_clock_mhz=210,
            mem_clock_mhz=1593,
            pcie_peak_bytes_per_s=25e9,
            nvlink_peak_bytes_per_s=300e9,
            unsupported=_RETIRED_PAGES,
        ),
        GpuModel(
            key="v100-sxm2-32gb",
            name="Tesla V100-SXM2-32GB",
            memory_mib=32768,
            reserved_mib=258,
            power_limit_w=300.0,
            idle_power_w=42.0,
            slowdown_temp_c=87,
            shutdown_temp_c=90,
            max_sm_clock_mhz=1530,
            idle_sm_clock_mhz=135,
            mem_clock_mhz=877,
            pcie_peak_bytes_per_s=12e9,
            nvlink_peak_bytes_per_s=150e9,
            unsupported=_ROW_REMAP,
        ),
    )
}

"""Codes the NVIDIA driver reports as numbers: the clock event reason bits and the GPU recovery action.

NVML and DCGM report both as integers (DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); these enums give them names.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class ClockEventReason(IntFlag):
    """Bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS (NVML's clocks event reasons)."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100

    @classmethod
    def names(cls, mask: int) -> list[str]:
        """The reasons set in a mask, by name: e.g. 0x24 -> ["sw_power_cap", "sw_thermal_slowdown"]."""
        return [str(reason.name).lower() for reason in cls if mask & reason]


class GpuRecoveryAction(IntEnum):
    """NVML's GPU recovery action (nvmlDeviceGetGpuRecoveryAction, field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    driver r570+; 5-7 in newer drivers). NONE: the GPU can be used again (after the action it asked for)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @classmethod
    def name_of(cls, code: int) -> str:
        """'gpu_reset', ...; a code newer than this table is 'unknown_<code>'."""
        try:
            return cls(code).name.lower()
        except ValueError:
            return f"unknown_{code}"

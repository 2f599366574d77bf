"""A stand-in for the pynvml module: two GPUs, one of them old enough to lack many queries."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class FakeNvml:
    NVMLError = NVMLError
    NVML_SUCCESS = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.xid_queue: list[tuple[int, int]] = []  # (gpu index, code)
        self.shut = False

    # lifecycle
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    # identity
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return [
            "GPU-11111111-2222-3333-4444-555555555555",
            "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        ][h]

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return [b"NVIDIA H100 80GB HBM3", b"Tesla V100-SXM2-32GB"][h]

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=["00000000:18:00.0", "00000000:2A:00.0"][h])

    def _new_only(self, h: int) -> None:
        if h == 1:
            raise NVMLError_NotSupported("Not Supported")

    # readings
    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 64

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[Any]:
        self._new_only(h)
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=71))]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 612_345  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self._new_only(h)
        return 123_456_789

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        gib = 1024**3
        return SimpleNamespace(total=80 * gib, free=20 * gib, used=60 * gib, reserved=gib // 2)

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return 3

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return 1000  # KB/s

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._new_only(h)
        return 0x4

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x1

    def nvmlDeviceGetViolationStatus(self, h: int, policy: int) -> Any:
        return SimpleNamespace(referenceTime=0, violationTime=5_000_000)  # ns

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return {(0, 0): 12, (1, 0): 1, (0, 1): 40, (1, 1): 2}[(kind, counter)]

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        if h == 0:
            raise NVMLError_NotSupported("Not Supported")  # Hopper remaps rows instead
        return [0x1000, 0x2000] if cause == 0 else []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        if h == 0:
            raise NVMLError_NotSupported("Not Supported")
        return 1

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        self._new_only(h)
        return (4, 1, 0, 1)

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        return 92 if kind == self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN else 87

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 4:
            raise NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        return 1 if counter == self.NVML_NVLINK_ERROR_DL_CRC_FLIT else 0

    # XID events
    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: str) -> None: ...

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.xid_queue:
            raise NVMLError_Timeout("Timeout")
        gpu, code = self.xid_queue.pop(0)
        return SimpleNamespace(device=gpu, eventData=code, eventType=8)

    def nvmlEventSetFree(self, event_set: str) -> None: ...

"""A stand-in for the pynvml module: an H100 and a V100 (old enough to lack many queries).

Field values answer per field, as NVML does: a field a GPU lacks gets its own
NOT_SUPPORTED return while the others succeed. With `call_cost_ms` each call
spends the time the real call took on an H100 (and `field_cost_ms` each field
of a field-values call), so the collector bench can price a read without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED = 3


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0")


def _spin(ms: float) -> None:
    """Spend `ms` of wall time: a sleep below a millisecond is far too coarse."""
    if ms >= 2:
        time.sleep(ms / 1000)
        return
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


class FakeNvml:
    NVMLError = NVMLError
    NVML_SUCCESS = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    nvmlEventTypeXidCriticalError = 8
    nvmlMemory_v2 = 0x02000028
    # Field ids as nvml.h numbers them (the source also knows them without these names).
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

    def __init__(
        self,
        *,
        call_cost_ms: dict[str, float] | None = None,
        field_cost_ms: dict[int, float] | None = None,
        gpus: int = 2,
    ) -> None:
        self.xid_queue: list[tuple[int, int]] = []  # (gpu index, code)
        self.shut = False
        self.gpus = gpus
        self.lost: set[int] = set()
        self.recovery_action: int | None = 0  # None: a driver before r570 (field unknown)
        self.pcie_bytes = [10_000_000, 20_000_000]  # cumulative TX; RX is half of it
        self.pcie_clock_us = 1_000_000
        self.memory_v2 = True
        self.energy_mj = 123_456_789
        self.dbe_volatile = 1
        self.calls: list[str] = []
        self._cost = call_cost_ms or {}
        self._field_cost = field_cost_ms or {}
        self._count_calls()

    def _count_calls(self) -> None:
        """Wrap every nvml* method once: each call is recorded and spends its cost."""
        for name in dir(type(self)):
            if name.startswith("nvml") and callable(getattr(type(self), name)):
                setattr(self, name, self._counted(name, getattr(self, name)))

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        cost = self._cost.get(name, 0.0)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if cost:
                _spin(cost)
            return fn(*args, **kwargs)

        return call

    # lifecycle
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def _gpu(self, h: int) -> int:
        if h in self.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return h % 2

    # identity
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return UUIDS[self._gpu(h)] if h < 2 else f"GPU-{h:08d}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return [b"NVIDIA H100 80GB HBM3", b"Tesla V100-SXM2-32GB"][self._gpu(h)]

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=BUS_IDS[self._gpu(h)] if h < 2 else f"00000000:{h + 0x30:02X}:00.0")

    def _new_only(self, h: int) -> None:
        if self._gpu(h) == 1:
            raise NVMLError_NotSupported("Not Supported")

    # readings
    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        self._gpu(h)
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._gpu(h)
        return 64

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._gpu(h)
        return 612_345  # mW

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._gpu(h)
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        self._gpu(h)
        gib, mib = 1024**3, 1024**2
        if version is None:  # v1: the driver's reserved memory is counted as used
            return SimpleNamespace(total=80 * gib, free=20 * gib, used=60 * gib + 480 * mib)
        if not self.memory_v2:
            raise NVMLError("Function Not Found")
        return SimpleNamespace(
            version=version, total=80 * gib, free=20 * gib, used=60 * gib, reserved=480 * mib
        )

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._gpu(h)
        return 1000  # KB/s

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return [5, 3][self._gpu(h)]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return [16, 8][self._gpu(h)]  # the V100's link trained at half width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return [5, 3][self._gpu(h)]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        self._gpu(h)
        return 16

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._new_only(h)
        return 0x4

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        self._gpu(h)
        return 0x1

    def nvmlDeviceGetViolationStatus(self, h: int, policy: int) -> Any:
        self._gpu(h)
        return SimpleNamespace(referenceTime=0, violationTime=5_000_000)  # ns

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        self._gpu(h)
        return 92 if kind == self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN else 87

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._gpu(h)
        return 700_000

    def _fields(self, h: int) -> dict[int, tuple[int, int] | None]:
        """field id -> (valueType, value) for one GPU; absent or None: not supported there."""
        hopper = self._gpu(h) == 0
        uint, ull = 1, 3
        total = self.pcie_bytes[h % 2]
        return {
            197: (ull, total) if hopper else None,  # PCIe bytes sent, cumulative
            198: (ull, total // 2) if hopper else None,
            230: (uint, self.recovery_action) if hopper and self.recovery_action is not None else None,
            82: (uint, 71) if hopper else None,  # memory temperature
            83: (ull, self.energy_mj) if hopper else None,  # energy, mJ
            94: (uint, 3),  # PCIe replays
            3: (ull, 12),
            4: (ull, self.dbe_volatile),
            5: (ull, 40),
            6: (ull, 2),  # ECC
            29: None if hopper else (uint, 2),  # Hopper remaps rows instead of retiring pages
            30: None if hopper else (uint, 0),
            31: None if hopper else (uint, 1),
            142: (uint, 4) if hopper else None,
            143: (uint, 1) if hopper else None,
            144: (uint, 0) if hopper else None,
            145: (uint, 1) if hopper else None,
            74: (ull, 5_000_000_000),  # time held below clocks by the power policy, ns
            75: (ull, 7_000_000) if hopper else None,  # ... by the thermal policy
            38: (ull, 4) if hopper else None,  # NVLink CRC flit errors, all links
            45: (ull, 0) if hopper else None,
            52: (ull, 0) if hopper else None,
            59: (ull, 0) if hopper else None,
        }

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[Any]:
        _spin(sum(self._field_cost.get(i, 0.0) for i in ids))
        table = self._fields(h)
        out = []
        for field_id in ids:
            found = table.get(field_id)
            value = SimpleNamespace(uiVal=0, ullVal=0, dVal=0.0)
            if found is not None:
                kind, number = found
                setattr(value, {1: "uiVal", 3: "ullVal"}[kind], number)
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=0 if found is not None else NOT_SUPPORTED,
                    valueType=found[0] if found is not None else 0,
                    value=value,
                    timestamp=self.pcie_clock_us,
                    latencyUsec=0,
                )
            )
        return out

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

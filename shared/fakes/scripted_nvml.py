"""A fake NVML whose readings a test sets (temperature, utilisation, memory, power, throttle reasons),
and an nvidia-smi runner that answers whatever fields it is asked for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shared.fakes.nvml import FakeNvml


class ScriptedNvml(FakeNvml):
    """Two GPUs, cool and busy until a test changes `temp_c`, `util_pct`, ... per GPU index."""

    def __init__(self) -> None:
        super().__init__()
        self.temp_c = [50, 50]
        self.util_pct = [90, 90]
        self.mem_used_mib = [40 * 1024, 40 * 1024]
        self.mem_total_mib = 80 * 1024
        self.power_mw = [300_000, 300_000]
        self.limit_mw = 700_000
        self.reasons = [0, 0]
        self.slowdown_c = 87
        self.reads = 0

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self.reads += h == 0
        return self.temp_c[h]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self.util_pct[h], memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: int, *args: Any, **kwargs: Any) -> Any:
        mib = 1024**2
        used, total = self.mem_used_mib[h] * mib, self.mem_total_mib * mib
        return SimpleNamespace(version=2, total=total, free=total - used, used=used, reserved=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.power_mw[h]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self.limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.reasons[h]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self.reasons[h]

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        return self.slowdown_c + 5 if kind == self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN else self.slowdown_c


class BrokenNvml(FakeNvml):
    """A host where the NVML library cannot start."""

    def nvmlInit(self) -> None:
        raise self.NVMLError("Driver Not Loaded")

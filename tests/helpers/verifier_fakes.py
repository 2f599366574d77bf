"""Fakes for the verifier's tests: an NVML module with adjustable load, and GPU compute backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from services.verifier.backends import Device, Timed

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]


class NVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """Two H100s on PCIe Gen5 x16 with four NVLinks each, or `gpus` of them; values are settable."""

    gpus: int = 2
    driver: str = "550.90.07"
    vbios: list[str] = field(default_factory=lambda: ["96.00.74.00.01", "96.00.74.00.01"])
    memory_used_mib: list[int] = field(default_factory=lambda: [512, 512])
    power_mw: list[int] = field(default_factory=lambda: [70_000, 72_000])
    energy_mj: list[int] = field(default_factory=lambda: [1_000_000, 2_000_000])
    processes: list[int] = field(default_factory=lambda: [0, 0])
    pcie_gen_current: int = 5
    no_nvlink: bool = False
    broken: bool = False  # nvmlInit fails, as on a host without the driver

    NVMLError = NVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_READ = 0

    def nvmlInit(self) -> None:
        if self.broken:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.90.07"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return UUIDS[h]

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetSerial(self, h: int) -> str:
        if h == 1:
            raise NVMLError("Not Supported")
        return "1650123456789"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=[b"00000000:18:00.0", b"00000000:2A:00.0"][h])

    def nvmlDeviceGetVbiosVersion(self, h: int) -> str:
        return self.vbios[h]

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=81559 * 2**20, used=self.memory_used_mib[h] * 2**20)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self.pcie_gen_current

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if self.no_nvlink or link >= 4:
            raise NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        return 4

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId="00000000:05:00.0")

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        return 0

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.power_mw[h]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self.energy_mj[h]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=1000 + i) for i in range(self.processes[h])]


class FakeBackend:
    """A GPU compute backend whose speed and correctness the test sets."""

    name = "fake"

    def __init__(
        self,
        *,
        device_ms: float = 0.01,
        corrupt: float = 0.0,
        nan: bool = False,
        fail: Exception | None = None,
        gpus: int = 1,
    ) -> None:
        self.device_ms, self.corrupt, self.nan, self.fail, self.gpus = device_ms, corrupt, nan, fail, gpus
        self.calls: list[tuple[int, str]] = []

    def devices(self) -> list[Device]:
        return [Device(i, UUIDS[i], "Fake H100") for i in range(self.gpus)]

    def matmul(
        self, device: int, a: np.ndarray, b: np.ndarray, *, dtype: str, warmup: int, repeats: int
    ) -> Timed:
        self.calls.append((device, dtype))
        if self.fail is not None:
            raise self.fail
        out = (a @ b).astype(np.float32)
        if self.corrupt:
            out[0, 0] += self.corrupt
        if self.nan:
            out[1, 1] = np.nan
        return Timed(result=out, times_ms=[self.device_ms] * repeats)

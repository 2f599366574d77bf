"""Where a GPU's processes are read from: NVML with /proc on a GPU node, or a mock fleet node's `/processes`.

NVML gives the PIDs and their memory (compute and graphics lists merged: a
process in both is `compute+graphics`) and, where the GPU keeps per-process
samples, SM and memory utilisation averaged since the last poll. The mock
fleet serves the same observations as JSON, with cgroup text in place of
/proc. The NVML module is injected, so tests run without a GPU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

import httpx

from gpuhealth.gpu.nvml import NvmlSession
from gpuhealth.gpu.readings import SourceError

from .proc_info import CgroupInfo, ProcInfo, ProcReader, parse_cgroup
from .redact import redact_command

log = logging.getLogger(__name__)
_NOT_AVAILABLE = 2**63  # NVML's "not available" memory is 2^64-1; anything this big is not a reading


@dataclass(slots=True)
class ObservedProcess:
    pid: int
    type: Literal["compute", "graphics", "compute+graphics"]
    used_memory_mib: int | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    info: ProcInfo = field(default_factory=ProcInfo)


@dataclass(slots=True)
class GpuObservation:
    gpu_uuid: str
    gpu_index: int
    processes: list[ObservedProcess]
    hostname: str | None = None


class ProcessSource(Protocol):
    @property
    def kind(self) -> Literal["nvml", "mock"]: ...

    def read(self) -> list[GpuObservation]: ...


def _pct(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and 0 <= value <= 100 else None


def _mib(value: Any) -> int | None:
    if not isinstance(value, int) or value < 0 or value >= _NOT_AVAILABLE:
        return None
    return value // (1024 * 1024)


class NvmlProcesses:
    """The local GPUs' processes through NVML; the module is injected so tests run without a GPU."""

    kind: Literal["nvml"] = "nvml"

    def __init__(
        self, nvml: Any | None = None, proc: ProcReader | None = None, window_s: float = 10.0
    ) -> None:
        self.session = NvmlSession(nvml)
        self.proc, self.window_s = proc or ProcReader(), window_s
        self._last_sample_us: dict[int, int] = {}

    def _utilisation(self, index: int, handle: Any) -> dict[int, tuple[float, float]] | None:
        """Per-PID mean SM and memory utilisation over the samples since the last poll.

        None when the GPU keeps no per-process samples. When it does, a process with
        no sample in the window did no work in it: it reads 0 (absent from the result).
        The first poll looks back `window_s`.
        """
        since = self._last_sample_us.get(index) or time.time_ns() // 1000 - int(self.window_s * 1e6)
        nvml = self.session.module
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self.session.error as e:
            if getattr(e, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
                return {}  # supported, but no process ran a kernel in the window
            return None
        sums: dict[int, tuple[float, float, int]] = {}
        for s in samples or []:
            stamp = int(getattr(s, "timeStamp", 0))
            sm, mem = _pct(s.smUtil), _pct(s.memUtil)
            if stamp <= since or sm is None or mem is None:
                continue
            a, b, n = sums.get(s.pid, (0.0, 0.0, 0))
            sums[s.pid] = (a + sm, b + mem, n + 1)
            self._last_sample_us[index] = max(self._last_sample_us.get(index, 0), stamp)
        return {pid: (round(a / n, 1), round(b / n, 1)) for pid, (a, b, n) in sums.items()}

    def read(self) -> list[GpuObservation]:
        observed: list[GpuObservation] = []
        for index, handle in enumerate(self.session.handles):
            uuid = self.session.query("nvmlDeviceGetUUID", handle)
            if uuid is None:
                continue
            by_pid: dict[int, ObservedProcess] = {}
            for kind, query in (
                ("compute", "nvmlDeviceGetComputeRunningProcesses"),
                ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            ):
                for p in self.session.query(query, handle) or []:
                    seen = by_pid.get(p.pid)
                    memory = _mib(getattr(p, "usedGpuMemory", None))
                    if seen is None:
                        by_pid[p.pid] = ObservedProcess(pid=p.pid, type=kind, used_memory_mib=memory)  # type: ignore[arg-type]
                    elif seen.type != kind:
                        seen.type = "compute+graphics"
                        seen.used_memory_mib = (
                            max(seen.used_memory_mib or 0, memory or 0) or seen.used_memory_mib
                        )
            usage = self._utilisation(index, handle) if by_pid else {}
            for pid, p in by_pid.items():
                if usage is not None:
                    p.sm_util_pct, p.mem_util_pct = usage.get(pid, (0.0, 0.0))
                p.info = self.proc.read(pid)
            text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            observed.append(GpuObservation(text, index, sorted(by_pid.values(), key=lambda p: p.pid)))
        self.proc.retain({p.pid for gpu in observed for p in gpu.processes})
        return observed

    def close(self) -> None:
        self.session.close()


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


class MockProcesses:
    """The mock fleet's simulated processes from one node's `/processes` (beside its `/metrics`)."""

    kind: Literal["mock"] = "mock"

    def __init__(self, metrics_url: str, timeout_s: float = 5.0, *, full_command_lines: bool = False) -> None:
        self.url = metrics_url.rsplit("/metrics", 1)[0] + "/processes"
        self.full_command_lines = full_command_lines
        self.client = httpx.Client(timeout=timeout_s)

    def _command(self, command: Any) -> str | None:
        if not isinstance(command, str) or self.full_command_lines:
            return command if isinstance(command, str) else None
        return redact_command(command)

    def read(self) -> list[GpuObservation]:
        try:
            response = self.client.get(self.url)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as e:
            raise SourceError(f"mock processes at {self.url}: {e}") from e
        observed = []
        for gpu in body.get("gpus", []):
            procs = [
                ObservedProcess(
                    pid=p["pid"],
                    type=p["type"],
                    used_memory_mib=p.get("used_memory_mib"),
                    sm_util_pct=p.get("sm_util_pct"),
                    mem_util_pct=p.get("mem_util_pct"),
                    info=ProcInfo(
                        executable=p.get("executable"),
                        command_line=self._command(p.get("command_line")),
                        user=p.get("user"),
                        start_time=_time(p.get("start_time")),
                        cgroup=parse_cgroup(p.get("cgroup", "")) if p.get("cgroup") else CgroupInfo(),
                    ),
                )
                for p in gpu.get("processes", [])
            ]
            observed.append(GpuObservation(gpu["gpu_uuid"], gpu["gpu_index"], procs, body.get("hostname")))
        return observed

    def close(self) -> None:
        self.client.close()

"""Processes per GPU: NVML's running compute and graphics processes, /proc facts, a classification each.

One `GpuProcesses` message per GPU per poll goes to `gpu-processes`, keyed by
the GPU's UUID. NVML gives the PIDs and their memory (compute and graphics
lists merged: a process in both is `compute+graphics`) and, where the GPU
keeps per-process samples, SM and memory utilisation since the last poll. The
mock fleet serves the same observations as JSON at each node's `/processes`,
with cgroup text in place of /proc. It runs on its own thread and interval
(GPUHEALTH_PROCESSES__*), beside the metrics poll it does not slow down.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx
from pydantic import BaseModel, Field

from shared.config import TopicSettings
from shared.errors import ConfigError
from shared.models import to_json
from shared.models_workload import GpuProcess, GpuProcesses
from shared.process_rules import DEFAULT_RULES, ProcessFacts, ProcessRules

from .proc_info import CgroupInfo, ProcInfo, ProcReader, parse_cgroup
from .readings import SourceError

if TYPE_CHECKING:  # the Kafka client is not needed to list processes (`python -m ...processes`)
    from .publisher import Publisher

log = logging.getLogger(__name__)
_NOT_AVAILABLE = 2**63  # NVML's "not available" memory is 2^64-1; anything this big is not a reading


class ProcessSection(BaseModel):
    """GPUHEALTH_PROCESSES__*"""

    enabled: bool = True
    interval_s: float = Field(default=10.0, ge=0.5, le=3600)
    rules_file: Path = DEFAULT_RULES
    proc_root: Path = Path("/proc")


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
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml, self.proc, self.window_s = nvml, proc or ProcReader(), window_s
        try:
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as e:
            raise SourceError(f"NVML is not usable here: {e}") from e
        self._last_sample_us: dict[int, int] = {}

    def _q(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _utilisation(self, index: int, handle: Any) -> dict[int, tuple[float, float]] | None:
        """Per-PID mean SM and memory utilisation over the samples since the last poll.

        None when the GPU keeps no per-process samples. When it does, a process with
        no sample in the window did no work in it: it reads 0 (absent from the result).
        The first poll looks back `window_s`.
        """
        since = self._last_sample_us.get(index) or time.time_ns() // 1000 - int(self.window_s * 1e6)
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_FOUND", 6):
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
        for index, handle in enumerate(self.handles):
            uuid = self._q(self.nvml.nvmlDeviceGetUUID, handle)
            if uuid is None:
                continue
            by_pid: dict[int, ObservedProcess] = {}
            for kind, query in (
                ("compute", "nvmlDeviceGetComputeRunningProcesses"),
                ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            ):
                for p in self._q(getattr(self.nvml, query), handle) or []:
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
        return observed

    def close(self) -> None:
        self._q(self.nvml.nvmlShutdown)


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


class MockProcesses:
    """The mock fleet's simulated processes from one node's `/processes` (beside its `/metrics`)."""

    kind: Literal["mock"] = "mock"

    def __init__(self, metrics_url: str, timeout_s: float = 5.0) -> None:
        self.url = metrics_url.rsplit("/metrics", 1)[0] + "/processes"
        self.client = httpx.Client(timeout=timeout_s)

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
                        command_line=p.get("command_line"),
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


def classify_process(rules: ProcessRules, p: ObservedProcess) -> GpuProcess:
    facts = ProcessFacts(
        executable=p.info.executable,
        command_line=p.info.command_line,
        type=p.type,
        used_memory_mib=p.used_memory_mib,
        sm_util_pct=p.sm_util_pct,
    )
    verdict = rules.classify(facts)
    return GpuProcess(
        pid=p.pid,
        type=p.type,
        used_memory_mib=p.used_memory_mib,
        sm_util_pct=p.sm_util_pct,
        mem_util_pct=p.mem_util_pct,
        executable=p.info.executable,
        command_line=p.info.command_line,
        user=p.info.user,
        start_time=p.info.start_time,
        container_id=p.info.cgroup.container_id,
        pod_uid=p.info.cgroup.pod_uid,
        qos_class=p.info.cgroup.qos_class,  # type: ignore[arg-type]
        classification=verdict.process_class,
        rule=verdict.rule,
    )


def process_messages(
    observed: Sequence[GpuObservation],
    rules: ProcessRules,
    *,
    source: Literal["nvml", "mock"],
    collector_id: str,
    hostname: str,
    now: datetime | None = None,
) -> list[GpuProcesses]:
    """One message per GPU; a process whose facts break the contract is logged and left out, not the GPU."""
    now = now or datetime.now(UTC)
    messages = []
    for gpu in observed:
        processes = []
        for p in gpu.processes:
            try:
                processes.append(classify_process(rules, p))
            except ValueError as e:
                log.warning("process %s on %s left out: %s", p.pid, gpu.gpu_uuid, e)
        messages.append(
            GpuProcesses(
                time=now,
                source=source,
                collector_id=collector_id,
                hostname=gpu.hostname or hostname,
                gpu_uuid=gpu.gpu_uuid,
                gpu_index=gpu.gpu_index,
                processes=processes[:1024],
            )
        )
    return messages


class ProcessWatch:
    """Polls the process sources on a monotonic schedule and publishes what it finds."""

    def __init__(
        self,
        *,
        sources: Sequence[ProcessSource],
        rules: ProcessRules,
        publisher: Publisher,
        topics: TopicSettings,
        collector_id: str,
        interval_s: float,
    ) -> None:
        self.sources, self.rules, self.publisher = sources, rules, publisher
        self.topic, self.collector_id, self.interval_s = topics.processes, collector_id, interval_s
        self.hostname = socket.gethostname()

    def poll_once(self) -> int:
        published = 0
        for source in self.sources:
            try:
                observed = source.read()
            except SourceError as e:
                log.warning("process listing failed: %s", e)
                continue
            for message in process_messages(
                observed,
                self.rules,
                source=source.kind,
                collector_id=self.collector_id,
                hostname=self.hostname,
            ):
                published += self.publisher.publish(self.topic, message.gpu_uuid, to_json(message))
        return published

    def run(self, stop: threading.Event) -> None:
        next_tick = time.monotonic()
        while not stop.is_set():
            self.poll_once()
            next_tick += self.interval_s
            if (late := time.monotonic() - next_tick) > 0:
                next_tick += (late // self.interval_s + 1) * self.interval_s
            stop.wait(max(0.0, next_tick - time.monotonic()))

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="process-watch", daemon=True)
        thread.start()
        return thread


def process_sources(collector_source: str, dcgm_urls: Sequence[str], timeout_s: float) -> list[ProcessSource]:
    """The mock fleet's nodes for a mock collector; otherwise the local GPUs through NVML, where it loads."""
    if collector_source == "mock":
        return [MockProcesses(url, timeout_s) for url in dcgm_urls]
    try:
        return [NvmlProcesses()]
    except (SourceError, ImportError, OSError) as e:
        log.warning("no process listing: NVML is not usable here (%s)", e)
        return []


def start_process_watch(
    section: ProcessSection,
    *,
    collector_source: str,
    dcgm_urls: Sequence[str],
    timeout_s: float,
    publisher: Publisher,
    topics: TopicSettings,
    collector_id: str,
    stop: threading.Event,
) -> threading.Thread | None:
    """The collector's one registration line: start listing processes on a thread, when enabled."""
    if not section.enabled:
        return None
    sources = process_sources(collector_source, dcgm_urls, timeout_s)
    if not sources:
        return None
    try:
        rules = ProcessRules.load(section.rules_file)
    except ConfigError as e:
        # The metrics poll goes on; the missing listing is loud in the log, not a dead collector.
        log.error("process listing disabled: %s", e)
        return None
    watch = ProcessWatch(
        sources=sources,
        rules=rules,
        publisher=publisher,
        topics=topics,
        collector_id=collector_id,
        interval_s=section.interval_s,
    )
    return watch.start(stop)


def main() -> int:
    """Print this host's GPU processes, classified, as JSON lines (one GPU a line, `--count` polls)."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m services.collector.processes")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    rules = ProcessRules.load(args.rules)
    source = NvmlProcesses()
    try:
        for poll in range(args.count):
            if poll:
                time.sleep(args.interval)
            for message in process_messages(
                source.read(), rules, source="nvml", collector_id="cli", hostname=socket.gethostname()
            ):
                sys.stdout.write(json.dumps(to_json(message)) + "\n")
            sys.stdout.flush()
    finally:
        source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Processes per GPU: NVML's running compute and graphics processes, /proc facts, a classification each.

One `GpuProcesses` message per GPU per poll goes to `gpu-processes`, keyed by
the GPU's UUID, each process classified by config/process-rules.toml (the
sources are in process_sources.py). It runs on its own thread and interval
(GPUHEALTH_PROCESSES__*), beside the metrics poll it does not slow down.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from gpuhealth.gpu.readings import SourceError
from shared.contract.models import to_json
from shared.contract.models_workload import GpuProcess, GpuProcesses
from shared.gpu.process_rules import DEFAULT_RULES, ProcessFacts, ProcessRules
from shared.plumbing.errors import ConfigError
from shared.settings.common import Section, TopicSettings

from .proc_info import ProcReader
from .process_sources import (
    GpuObservation,
    MockProcesses,
    NvmlProcesses,
    ObservedProcess,
    ProcessSource,
)

if TYPE_CHECKING:  # the Kafka client is not needed to list processes (`python -m ...processes`)
    from .publisher import Publisher

log = logging.getLogger(__name__)
PROCESSES = TopicSettings.entry("processes")  # its messages' key and value


class ProcessSection(Section):
    """GPUHEALTH_PROCESSES__*: the collector's listing of each GPU's processes."""

    enabled: bool = False
    """List each GPU's processes (on their own thread) to `gpu-processes`, which must exist
    (`make topics`)."""
    interval_s: float = Field(default=10.0, ge=0.5, le=3600)
    """How often the processes are listed."""
    rules_file: Path = DEFAULT_RULES
    """The ordered rules that classify a process (training, inference, LLM serving, gaming, compute)."""
    proc_root: Path = Path("/proc")
    """Where the processes' executables, command lines, users and cgroups are read."""
    full_command_lines: bool = False
    """Publish command lines whole. Off, the values of secret-named flags (token, key, password...),
    of `KEY=VALUE` arguments and URLs' user information are masked (`***`) on the node."""


def classify_process(rules: ProcessRules, p: ObservedProcess) -> GpuProcess:
    facts = ProcessFacts(
        executable=p.info.executable,
        command_line=p.info.command_line,
        type=p.type,
        used_memory_mib=p.used_memory_mib,
        sm_util_pct=p.sm_util_pct,
        launcher=launch.launcher if (launch := p.info.launch) else None,
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
        launcher=launch.launcher if launch else None,  # type: ignore[arg-type]
        job_key=launch.job_key if launch else None,
        rank=launch.rank if launch else None,
        local_rank=launch.local_rank if launch else None,
        world_size=launch.world_size if launch else None,
        launch_note=(p.info.launch_note or "")[:500] or None,
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
                published += self.publisher.publish(self.topic, *PROCESSES.encode(message))
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


def process_sources(
    collector_source: str, dcgm_urls: Sequence[str], timeout_s: float, *, full_command_lines: bool = False
) -> list[ProcessSource]:
    """The mock fleet's nodes for a mock collector; otherwise the local GPUs through NVML, where it loads.
    Their command lines are redacted unless `full_command_lines`."""
    if collector_source == "mock":
        return [MockProcesses(url, timeout_s, full_command_lines=full_command_lines) for url in dcgm_urls]
    try:
        return [NvmlProcesses(proc=ProcReader(full_command_lines=full_command_lines))]
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
    sources = process_sources(
        collector_source, dcgm_urls, timeout_s, full_command_lines=section.full_command_lines
    )
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

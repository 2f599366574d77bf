"""CPU time by party, read from Linux /proc: where a benchmark's cycles went.

On a small machine every party of a pipeline (the service, PostgreSQL, Kafka)
shares the same cores, so throughput is bounded by the CPU each row costs all
of them together. The meter takes a snapshot before and after a measured span
and gives each party's CPU seconds in between (user + system, steal excluded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MACHINE = "whole machine"


def process_cpu(pid: int) -> float | None:
    try:
        # fields after the parenthesised command name: utime and stime are the 12th and 13th
        stat = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None  # gone, or not a process


def process_rss_mb(pid: int) -> float | None:
    """The process's resident memory (VmRSS), in MiB; None when it is gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None  # a kernel thread: no memory of its own


def _name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _machine_busy() -> float:
    """CPU seconds all cores spent on anything but idle, I/O wait and steal."""
    values = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle, iowait, steal = values[3], values[4], values[7] if len(values) > 7 else 0
    return (sum(values[:8]) - idle - iowait - steal) / _TICK


@dataclass
class CpuMeter:
    """Parties are named sets of processes: fixed pids, or a test on the process name."""

    pids: dict[str, Callable[[], Iterable[int]]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # party -> process name (comm)
    _start: dict[str, dict[int, float]] = field(default_factory=dict)
    _machine: float = 0.0

    @staticmethod
    def available() -> bool:
        return (PROC / "stat").exists()

    def _members(self) -> dict[str, list[int]]:
        members = {party: list(pids()) for party, pids in self.pids.items()}
        if self.names:
            parties = {name: party for party, name in self.names.items()}
            for entry in PROC.iterdir():
                if entry.name.isdigit() and (party := parties.get(_name(int(entry.name)))):
                    members.setdefault(party, []).append(int(entry.name))
        return members

    def _snapshot(self) -> dict[str, dict[int, float]]:
        return {
            party: {pid: cpu for pid in pids if (cpu := process_cpu(pid)) is not None}
            for party, pids in self._members().items()
        }

    def start(self) -> None:
        self._start, self._machine = self._snapshot(), _machine_busy()

    def stop(self) -> dict[str, float]:
        """CPU seconds of each party since start(); a process born meanwhile counts from zero."""
        machine, end = _machine_busy(), self._snapshot()
        used = {
            party: sum(cpu - self._start.get(party, {}).get(pid, 0.0) for pid, cpu in pids.items())
            for party, pids in end.items()
        }
        used[MACHINE] = machine - self._machine
        return used

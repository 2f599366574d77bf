"""The host's own identity from /proc and /etc: CPU model, sockets, cores, memory, OS, kernel.

Read from files (the root is a parameter, so tests point it at a recorded
tree); whatever a file does not say is None, never a guess.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from shared.contract.models_verify import HostIdentity


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cpu_facts(cpuinfo: str | None) -> tuple[str | None, int | None, int | None, int | None]:
    """(model, sockets, physical cores, logical CPUs) from /proc/cpuinfo."""
    if not cpuinfo:
        return None, None, None, None
    model: str | None = None
    sockets: set[str] = set()
    cores: set[tuple[str, str]] = set()
    threads = 0
    physical, core = "", ""
    for block in cpuinfo.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip()] = value.strip()
        if "processor" not in fields:
            continue
        threads += 1
        model = model or fields.get("model name") or fields.get("Model") or None
        physical, core = fields.get("physical id", ""), fields.get("core id", "")
        if physical:
            sockets.add(physical)
        if physical and core:
            cores.add((physical, core))
    return (
        model,
        len(sockets) or None,
        len(cores) or None,
        threads or None,
    )


def _memory_bytes(meminfo: str | None) -> int | None:
    for line in (meminfo or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _os_name(os_release: str | None) -> str | None:
    values: dict[str, str] = {}
    for line in (os_release or "").splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name.strip()] = value.strip().strip('"')
    return values.get("PRETTY_NAME") or values.get("NAME") or None


def host_identity(root: Path = Path("/")) -> HostIdentity:
    """This host's identity; a fact its files do not state is None."""
    model, sockets, cores, threads = _cpu_facts(_read(root / "proc/cpuinfo"))
    release = _read(root / "proc/sys/kernel/osrelease")
    if root == Path("/"):
        threads = threads or os.cpu_count()
        release = release or platform.release()
    return HostIdentity(
        cpu_model=model[:253] if model else None,
        cpu_sockets=sockets,
        cpu_cores=cores,
        cpu_threads=threads,
        memory_total_bytes=_memory_bytes(_read(root / "proc/meminfo")),
        os_name=(_os_name(_read(root / "etc/os-release")) or "")[:253] or None,
        kernel=release.strip()[:253] if release and release.strip() else None,
        architecture=(platform.machine() or None) if root == Path("/") else None,
    )

"""What /proc says of a process: executable, command line, user, start time, container, pod and launch.

The container and the Kubernetes pod come from the process's cgroup path,
which names them in every common layout: cgroup v1 (`/docker/<id>`,
`/kubepods/burstable/pod<uid>/<id>`) and v2 with the systemd driver
(`kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`, `crio-<id>`,
`docker-<id>.scope`, `libpod-<id>`). A process that has gone, or that this
collector may not read (another PID namespace, no permission), gives what
could be read and None for the rest: it never fails the poll. The launch (a
torchrun, deepspeed or accelerate worker's ranks and job key, launcher.py) comes
from the environment and the parents; where /proc refuses them the reason is
kept in `launch_note`.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .launcher import ENVIRON_MAX, Launch, LaunchError, Stat, launch_from, parents, parse_environ, parse_stat
from .redact import redact_argv

MAX_TEXT = 4096
MAX_KEPT = 4096  # processes whose launch is kept; a GPU node runs far fewer GPU processes
_CONTAINER = re.compile(
    r"(?:^|/)(?:docker-|cri-containerd-|crio-|libpod-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)
_QOS = re.compile(r"kubepods[-/.](burstable|besteffort)")


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    container_id: str | None = None
    pod_uid: str | None = None
    qos_class: str | None = None


def parse_cgroup(text: str) -> CgroupInfo:
    """Container id, pod UID and QoS class from the contents of /proc/PID/cgroup.

    The v2 line (`0::/...`) is preferred; with v1 any controller's path names them.
    A conmon (`crio-conmon-<id>`) is the runtime's monitor, not the container.
    """
    paths: list[str] = []
    for line in text.splitlines()[:64]:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            paths.insert(0, parts[2]) if parts[0] == "0" else paths.append(parts[2])
    for path in paths:
        path = path[:MAX_TEXT].rstrip("/")
        segments = path.split("/")
        container = None
        for segment in reversed(segments):
            if "conmon" in segment:
                continue
            m = _CONTAINER.search("/" + segment)
            if m:
                container = m.group(1)
                break
        pod = _POD.search(path)
        if container is None and pod is None:
            continue
        qos = None
        if "kubepods" in path:
            q = _QOS.search(path)
            qos = q.group(1) if q else "guaranteed"
        return CgroupInfo(
            container_id=container,
            pod_uid=pod.group(1).replace("_", "-") if pod else None,
            qos_class=qos if pod else None,
        )
    return CgroupInfo()


@dataclass(frozen=True, slots=True)
class ProcInfo:
    executable: str | None = None
    command_line: str | None = None
    user: str | None = None
    start_time: datetime | None = None
    cgroup: CgroupInfo = CgroupInfo()
    launch: Launch | None = None
    launch_note: str | None = None  # why the launch is not known: environ unreadable, variables malformed


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()[: MAX_TEXT * 4]
    except OSError:
        return None


def _read_environ(path: Path) -> bytes:
    """The head of an environ file; OSError (permission, a process gone) to the caller."""
    with path.open("rb") as handle:
        return handle.read(ENVIRON_MAX + 1)


def _why(e: OSError) -> str:
    if isinstance(e, PermissionError):
        return "environ not readable: permission denied (another user's process)"
    if isinstance(e, FileNotFoundError | ProcessLookupError):
        return "environ not readable: the process has gone"
    return f"environ not readable: {e.strerror or type(e).__name__}"


def _clean(text: str) -> str | None:
    text = "".join(c if c.isprintable() else " " for c in text).strip()[:MAX_TEXT]
    return text or None


def boot_time(proc: Path = Path("/proc")) -> float | None:
    raw = _read(proc / "stat")
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def start_time_from_stat(stat: str, btime: float, ticks_per_s: int) -> datetime | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot) as a UTC time; comm may hold ') '."""
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return datetime.fromtimestamp(btime + int(fields[19]) / ticks_per_s, UTC)


def _same_process(a: Stat | None, b: Stat | None) -> bool:
    """One process, not a reused pid or an exec'd program (the parent's pid may change: reparenting)."""
    return a is not None and b is not None and (a.start_ticks, a.comm) == (b.start_ticks, b.comm)


def _user(status: bytes | None) -> str | None:
    for line in (status or b"").decode(errors="replace").splitlines():
        if line.startswith("Uid:") and len(line.split()) > 1 and line.split()[1].isdigit():
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return None


class ProcReader:
    """Reads processes from a /proc tree (a recorded one in tests).

    A process's launch (its environment, up to 256 KiB, and its parents' stat and command lines) is
    read once per process: it is kept by pid with the process's identity, its start time and name
    from /proc/PID/stat, so a pid the kernel gave to a new process, or a process that exec'd another
    program (an exec keeps pid and start time but renames it, unless the new program has the same name),
    is read afresh. `retain` forgets the processes a poll no longer saw.
    """

    def __init__(
        self, root: Path = Path("/proc"), hostname: str | None = None, *, full_command_lines: bool = False
    ) -> None:
        self.root = root
        self.full_command_lines = full_command_lines  # else secrets are masked (services.collector.redact)
        self.hostname = hostname or socket.gethostname()
        self.btime = boot_time(root)
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._launches: dict[int, tuple[Stat, tuple[Launch | None, str | None]]] = {}

    def read(self, pid: int) -> ProcInfo:
        base = self.root / str(pid)
        try:
            exe: str | None = os.readlink(base / "exe")
        except OSError:
            exe = None
        raw_cmd = _read(base / "cmdline")
        command = None
        if raw_cmd:
            argv = raw_cmd.rstrip(b"\0").decode(errors="replace").split("\0")
            command = _clean(" ".join(argv if self.full_command_lines else redact_argv(argv)))
        if exe is None and command:
            exe = command.split(" ", 1)[0]
        raw_stat = _read(base / "stat")
        stat_text = raw_stat.decode(errors="replace") if raw_stat else ""
        started = None
        if stat_text and self.btime is not None:
            started = start_time_from_stat(stat_text, self.btime, self.ticks)
        cgroup = _read(base / "cgroup")
        launch, note = self._known_launch(pid, parse_stat(stat_text))
        return ProcInfo(
            executable=_clean(exe.removesuffix(" (deleted)")) if exe else None,
            command_line=command,
            user=_user(_read(base / "status")),
            start_time=started,
            cgroup=parse_cgroup(cgroup.decode(errors="replace")) if cgroup else CgroupInfo(),
            launch=launch,
            launch_note=note,
        )

    def stat(self, pid: int) -> Stat | None:
        raw = _read(self.root / str(pid) / "stat")
        return parse_stat(raw.decode(errors="replace")) if raw else None

    def retain(self, pids: Collection[int]) -> None:
        """Forget the launches of every process but `pids` (those a poll saw: the others have gone,
        or left the GPUs; one that comes back is read again)."""
        for pid in self._launches.keys() - set(pids):
            del self._launches[pid]

    def _known_launch(self, pid: int, identity: Stat | None) -> tuple[Launch | None, str | None]:
        """The launch kept for this process (`identity`: its stat, read just before), else read now and
        kept, unless the process went, or its pid was reused, while it was read (stat read again after)."""
        if identity is None:  # gone, or no stat to know it by: nothing to keep it under
            self._launches.pop(pid, None)
            return self.launch(pid)
        kept = self._launches.get(pid)
        if kept is not None and _same_process(kept[0], identity):
            return kept[1]
        found = self.launch(pid)
        if _same_process(self.stat(pid), identity):
            while len(self._launches) >= MAX_KEPT:  # a caller that never retains: the oldest go first
                del self._launches[next(iter(self._launches))]
            self._launches[pid] = (identity, found)
        else:
            self._launches.pop(pid, None)
        return found

    def launch(self, pid: int) -> tuple[Launch | None, str | None]:
        """(launch, why it is not known), from the process's environment and its parents' command lines,
        read now (`read` keeps what this found per process)."""
        try:
            env = parse_environ(_read_environ(self.root / str(pid) / "environ"))
        except OSError as e:
            return None, _why(e)
        commands = []
        for parent in parents(pid, self.stat):
            raw = _read(self.root / str(parent) / "cmdline")
            commands.append(raw.replace(b"\0", b" ").decode(errors="replace") if raw else "")
        try:
            return launch_from(env, commands, self.hostname), None
        except LaunchError as e:
            return None, f"launcher variables malformed: {e}"[:MAX_TEXT]

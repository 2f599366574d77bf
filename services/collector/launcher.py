"""Jobs as their launchers leave them: a torchrun, deepspeed or accelerate worker's environment and parents.

A worker a launcher started carries `LOCAL_RANK` and `WORLD_SIZE` (and `RANK`) in its
environment, and its parent, or a parent's parent, is the launcher: `torchrun` or
`python -m torch.distributed.run`, `python -m deepspeed.launcher.launch` (what `deepspeed`
starts on each node), `accelerate launch`. Such a worker is a training process on its first
poll whatever its command line says, and the GPUs whose workers share a job key ran one job:

- the job key is the elastic run id (`TORCHELASTIC_RUN_ID`, the same on every node of a
  torchrun job; torchrun's default `none` is no id), else `MASTER_ADDR:MASTER_PORT`, with
  the host's name before a loopback address (two single-node jobs on two hosts both say
  `127.0.0.1:29500`).
- the launcher is the nearest parent whose command line names one, else what only a
  launcher sets in the environment (`ACCELERATE_*`; `TORCHELASTIC_RUN_ID`). Rank variables
  with no launcher known give `launcher=None`: a job key, but no classification.

Only these variables are read out of the environment, which holds secrets: nothing else of
it is kept, logged or sent. What /proc refuses (another user's process without
CAP_SYS_PTRACE, a process that has gone) is a reason recorded beside the process, never an
error of the poll.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENVIRON_MAX = 256 * 1024  # bytes of /proc/PID/environ read; a longer one is cut at the last whole entry
MAX_DEPTH = 8  # parents walked up from a worker: torchrun's agent is its parent, deepspeed's its grandparent
MAX_VALUE = 200
WANTED = frozenset(
    {
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
_ACCELERATE = "ACCELERATE_"
_LAUNCHERS = (  # (launcher, command-line pattern), the most specific first
    ("accelerate", re.compile(r"(^|[/ ])accelerate(\.exe)? launch\b|\baccelerate\.commands\.launch\b")),
    ("deepspeed", re.compile(r"\bdeepspeed\.launcher\.(launch|runner)\b|(^|[/ ])deepspeed( |$)")),
    ("torchrun", re.compile(r"(^|[/ ])torchrun( |$)|\btorch\.distributed\.(run|launch)\b")),
)
_LOOPBACK = re.compile(r"^(localhost|127(\.\d{1,3}){3}|::1|\[::1\])$", re.IGNORECASE)
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


class LaunchError(ValueError):
    """An environment's launcher variables are present but not what a launcher writes."""


@dataclass(frozen=True, slots=True)
class Launch:
    """What a launched worker's environment and parents say of its job."""

    launcher: str | None  # torchrun, deepspeed, accelerate; None: rank variables, no launcher known
    job_key: str | None  # elastic:<run id>, or master:<addr>:<port> (host/ before a loopback address)
    rank: int | None
    local_rank: int
    world_size: int


def parse_environ(blob: bytes) -> dict[str, str]:
    """The launcher variables of a /proc/PID/environ blob (NUL-separated KEY=VALUE), nothing else.

    Bounded and total: a blob over ENVIRON_MAX is cut at its last whole entry, bytes that are
    not UTF-8 are replaced, an entry without `=` is skipped, and the last of a repeated key wins
    (as getenv reads it). `ACCELERATE_*` keys are kept by name only (their values are dropped).
    """
    if len(blob) > ENVIRON_MAX:
        blob = blob[: blob.rfind(b"\0", 0, ENVIRON_MAX) + 1]
    found: dict[str, str] = {}
    for entry in blob.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep or not key:
            continue
        name = key.decode("ascii", errors="replace")
        if name in WANTED:
            found[name] = value[: MAX_VALUE * 4].decode(errors="replace")
        elif name.startswith(_ACCELERATE):
            found[name[:MAX_VALUE]] = ""
    return found


def _count(env: Mapping[str, str], name: str, *, low: int, high: int) -> int | None:
    text = env.get(name)
    if text is None:
        return None
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 9 or not low <= int(text) <= high:
        raise LaunchError(f"{name}={text[:40]!r} is not a number in {low}..{high}")
    return int(text)


def _token(env: Mapping[str, str], name: str) -> str | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    if len(text) > MAX_VALUE or not _PRINTABLE.match(text):
        raise LaunchError(f"{name} is not a printable token of at most {MAX_VALUE} characters")
    return text


def launcher_of(commands: list[str], env: Mapping[str, str]) -> str | None:
    """The nearest parent's launcher (`commands`: parents' command lines, nearest first), else the env's."""
    for command in commands:
        for name, pattern in _LAUNCHERS:
            if pattern.search(command[:4096]):
                return name
    if any(k.startswith(_ACCELERATE) for k in env):
        return "accelerate"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return None


def job_key(env: Mapping[str, str], hostname: str) -> str | None:
    run_id = _token(env, "TORCHELASTIC_RUN_ID")
    if run_id is not None and run_id.lower() != "none":  # torchrun's default rendezvous id
        return f"elastic:{run_id}"[:MAX_VALUE]
    addr, port = _token(env, "MASTER_ADDR"), _count(env, "MASTER_PORT", low=1, high=65535)
    if addr is None or port is None:
        return None
    place = f"{hostname[:64]}/" if _LOOPBACK.match(addr) else ""
    return f"master:{place}{addr}:{port}"[:MAX_VALUE]


def launch_from(env: Mapping[str, str], parents: list[str], hostname: str) -> Launch | None:
    """The worker's launch, None when its environment has no LOCAL_RANK and WORLD_SIZE.

    LaunchError when they (or RANK, MASTER_PORT, the run id) are not what a launcher writes.
    """
    local_rank = _count(env, "LOCAL_RANK", low=0, high=65535)
    world_size = _count(env, "WORLD_SIZE", low=1, high=1_000_000)
    if local_rank is None or world_size is None:
        return None
    rank = _count(env, "RANK", low=0, high=999_999)
    if (rank is not None and rank >= world_size) or local_rank >= world_size:
        raise LaunchError(f"rank {rank} / local rank {local_rank} outside WORLD_SIZE={world_size}")
    return Launch(
        launcher=launcher_of(parents, env),
        job_key=job_key(env, hostname),
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
    )


@dataclass(frozen=True, slots=True)
class Stat:
    """Of /proc/PID/stat: the parent's pid, the start time (clock ticks after boot) and the name (comm)."""

    ppid: int
    start_ticks: int
    comm: str = ""  # an exec renames the process (same pid and start time, a new environment)


def parse_stat(text: str) -> Stat | None:
    """ppid (field 4), starttime (field 22) and comm (field 2, which may hold spaces and ')')."""
    close = text.rfind(")")
    fields = text[close + 2 :].split()
    if close < 0 or len(fields) < 20 or not fields[1].isdigit() or not fields[19].isdigit():
        return None
    return Stat(ppid=int(fields[1]), start_ticks=int(fields[19]), comm=text[text.find("(") + 1 : close])


def parents(pid: int, stat_of: Callable[[int], Stat | None], depth: int = MAX_DEPTH) -> list[int]:
    """The pids above `pid`, nearest first, up to `depth`, stopping below pid 1.

    A tree read from a live /proc can lie: a parent that exits leaves its pid to be reused, and
    two reads are not one snapshot. So the walk stops at a parent that has gone, at one that
    started after its child (a reused pid, not the parent), and at a pid seen before (a cycle).
    """
    found: list[int] = []
    seen = {pid}
    child = stat_of(pid)
    while child is not None and len(found) < depth:
        ppid = child.ppid
        if ppid <= 1 or ppid in seen:
            break
        parent = stat_of(ppid)
        if parent is None or parent.start_ticks > child.start_ticks:
            break
        found.append(ppid)
        seen.add(ppid)
        child = parent
    return found

"""A small process supervisor for the native stack (`make up`): start, restart, log, stop.

Why not honcho or a Procfile runner: those run in the foreground and give up
on a crashed process. This one runs detached, restarts a process that dies
(with backoff, so a crash loop does not spin), gives each process its own log
file, and on SIGTERM stops its children with SIGTERM, waiting for them to
flush and commit (the services exit 0 on it) before it exits itself.

    python -m scripts.supervise deploy/local-stack.toml --logs DIR

A process may run as several replicas (`replicas = "${GPUHEALTH_SCORERS}"`):
each is its own child (`scorer-0`, `scorer-1`, ...), and its values may say
`${NAME+REPLICA*STEP}`, NAME's number plus STEP per replica before it (each
scorer's /metrics port, for one).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import IO, Any

from shared.plumbing.errors import ConfigError
from shared.plumbing.logging import setup_logging
from shared.plumbing.running import ServiceRun
from shared.settings.common import Settings, ShutdownSettings, load_settings

log = logging.getLogger("supervise")


@dataclass(slots=True)
class Child:
    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    backoff_s: float = 1.0
    next_start: float = 0.0
    started_at: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        command = [sys.executable if self.command[0] == "python" else self.command[0], *self.command[1:]]
        self.proc = subprocess.Popen(
            command, env={**os.environ, **self.env}, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.started_at = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.proc.pid)

    def reap(self) -> int | None:
        """The exit code if the process has ended since the last look."""
        if self.proc is None or (code := self.proc.poll()) is None:
            return None
        self.proc = None
        if self._log:
            self._log.close()
        return code


class _SpecTemplate(Template):
    # `${NAME}`, and `${NAME+REPLICA*STEP}` (a number moved along for each replica)
    braceidpattern = r"(?a:[_a-z][_a-z0-9]*(?:\+REPLICA\*[0-9]{1,6})?)"


class _Values(dict[str, str]):
    """The environment, plus REPLICA and `NAME+REPLICA*STEP` worked out for one replica."""

    def __init__(self, environ: Mapping[str, str], replica: int) -> None:
        super().__init__()
        self.environ, self.replica = environ, replica

    def __missing__(self, key: str) -> str:
        if key == "REPLICA":
            return str(self.replica)
        name, moved, step = key.partition("+REPLICA*")
        if not moved:
            return self.environ[key]
        try:
            return str(int(self.environ[name]) + self.replica * int(step))
        except ValueError:
            raise ValueError(f"${{{key}}}: {name} is {self.environ[name]!r}, not a number") from None


def expand(value: object, environ: Mapping[str, str] | None = None, replica: int = 0) -> str:
    """`${NAME}` in a spec value, from the environment (scripts/env.sh exports the stack's ports), as
    replica `replica` of its process sees it.

    A name that is not set is an error (KeyError), not an empty string: a stack
    must not start on a half-written address.
    """
    return _SpecTemplate(str(value)).substitute(_Values(os.environ if environ is None else environ, replica))


def _replicas(name: str, process: dict[str, Any]) -> list[tuple[str, int]]:
    """(child name, replica index) of each replica of a process (one, unless it says `replicas`)."""
    text = expand(process.get("replicas", "1"))
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise ValueError(f"process {name}: replicas must be 1 to 64, not {text!r}")
    count = int(text)
    return [(name if count == 1 else f"{name}-{i}", i) for i in range(count)]


def load(path: Path, logs: Path) -> list[Child]:
    spec: dict[str, Any] = tomllib.loads(path.read_text())
    logs.mkdir(parents=True, exist_ok=True)
    return [
        Child(
            name=child,
            command=[expand(part, replica=i) for part in p["command"]],
            env={k: expand(v, replica=i) for k, v in p.get("env", {}).items()},
            log_path=logs / f"{child}.log",
        )
        for name, p in spec.get("process", {}).items()
        for child, i in _replicas(name, p)
    ]


def ready_urls(path: Path) -> list[str]:
    """The URL each child of the stack answers on once it is ready (scripts/stack.sh waits on them)."""
    spec: dict[str, Any] = tomllib.loads(path.read_text())
    return [
        expand(p["ready_url"], replica=i)
        for name, p in spec.get("process", {}).items()
        if "ready_url" in p
        for _, i in _replicas(name, p)
    ]


def supervise(children: list[Child], stop: threading.Event, stop_timeout_s: float = 25.0) -> None:
    """Run the children until `stop`; then SIGTERM each, killing one still running after `stop_timeout_s`."""
    for child in children:
        child.start()
    while not stop.wait(0.5):
        now = time.monotonic()
        for child in children:
            code = child.reap()
            if code is not None:
                # A process that ran a while before dying gets a fresh backoff.
                child.backoff_s = 1.0 if now - child.started_at > 60 else min(child.backoff_s * 2, 60)
                child.next_start = now + child.backoff_s
                child.restarts += 1
                log.error(
                    "%s exited with %d; restart %d in %.0f s",
                    child.name,
                    code,
                    child.restarts,
                    child.backoff_s,
                )
            if child.proc is None and now >= child.next_start:
                child.start()
    for child in children:
        if child.proc is not None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + stop_timeout_s
    for child in children:
        if child.proc is None:
            continue
        try:
            code = child.proc.wait(max(0.1, deadline - time.monotonic()))
            log.info("%s stopped (%d)", child.name, code)
        except subprocess.TimeoutExpired:
            log.error("%s did not stop in time; killing it", child.name)
            child.proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.supervise", description=__doc__)
    parser.add_argument("spec", type=Path)
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("--pidfile", type=Path, help="write this process's pid here while it runs")
    args = parser.parse_args()
    setup_logging("INFO", service="supervise")
    try:
        children = load(args.spec, args.logs)
    except (OSError, tomllib.TOMLDecodeError, KeyError, ValueError) as e:
        log.error("cannot read %s: %s", args.spec, e)
        return 2
    try:
        # The children stop within their shutdown deadline (the one setting: they inherit the
        # environment); a little more for the last of them to exit, and this process's own past that.
        children_s = load_settings(Settings).shutdown.timeout_s + 5
    except ConfigError as e:
        log.error("%s", e)
        return 2
    with ServiceRun("supervise", ShutdownSettings(timeout_s=children_s + 5)) as life:
        if args.pidfile:
            args.pidfile.write_text(f"{os.getpid()}\n")
            life.callback(_remove_pidfile, args.pidfile)
        supervise(children, life.stop, children_s)
    return 0


def _remove_pidfile(path: Path) -> None:
    if path.read_text().strip() == str(os.getpid()):
        path.unlink()


if __name__ == "__main__":
    sys.exit(main())

"""Running a service as `python -m services.<name>` in a test and stopping it as an orchestrator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.paths import REPO


@contextmanager
def service_process(name: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The service running with `env` added to this environment; killed if the block leaves it running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", f"services.{name}"], cwd=REPO, text=True,
        env=os.environ | {"PYTHONPATH": str(REPO), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


class Watched:
    """A service process whose output is read as it comes (so a test can wait on a line of it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="service-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def output(self) -> str:
        return "".join(self.lines)

    def sigterm(self, deadline_s: float) -> float:
        """SIGTERM; it must exit 0 within `deadline_s`, saying it stopped. Returns how long it took."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(deadline_s + 30)  # past the deadline: to say by how much, then fail
        except subprocess.TimeoutExpired:
            gone = deadline_s + 30
            raise AssertionError(f"still running {gone:g} s after SIGTERM\n{self.output()}") from None
        took = time.monotonic() - started
        self._reader.join(5)
        assert self.proc.returncode == 0, f"exit {self.proc.returncode} after {took:.1f} s\n{self.output()}"
        late = f"exited {took:.1f} s after SIGTERM, past its {deadline_s:g} s"
        assert took <= deadline_s, f"{late}\n{self.output()}"
        assert '"msg": "stopped"' in self.output(), self.output()
        return took


@contextmanager
def watched_service(name: str, env: dict[str, str]) -> Iterator[Watched]:
    """`service_process`, its output read as it comes."""
    with service_process(name, env) as proc:
        yield Watched(proc)


def sigterm(proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    """SIGTERM, then the exit status must be 0 and the service must say it stopped; returns its output."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    assert '"msg": "stopped"' in out, out
    return out


def ollama_answers(url: str) -> bool:
    """Whether an Ollama API (the mock, or the monitor's proxy in front of it) answers at `url`."""
    try:
        return httpx.get(f"{url}/api/version", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def waiting_on_a_lock(db: DatabaseSettings) -> bool:
    """Whether a session waits now on a lock on a table of `db`'s own schema (its search path): a service's
    on this test's tables, not another test's anywhere on the shared server."""
    with connect(db.model_copy(update={"search_path": None})) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE NOT l.granted AND n.nspname = %s AND l.pid <> pg_backend_pid()",
            (db.search_path,),
        ).fetchone()
    return bool(row and int(str(row[0])) > 0)


def serves_until_stopped(run: Callable[[threading.Event], object], url: str) -> None:
    """`run(stop)` in a thread answers 200 at `url`, and returns within 10 s of `stop` being set."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(stop,))
    thread.start()
    try:
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()

"""Running a service as `python -m services.<name>` in a test and stopping it as an orchestrator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from shared.config import DatabaseSettings
from shared.db import connect
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

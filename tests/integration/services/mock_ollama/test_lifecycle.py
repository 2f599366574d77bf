"""The mock Ollama stopped by SIGTERM: exit 0, through its lifecycle."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from evaluation.pipeline import wait_until

REPO = Path(__file__).resolve().parents[4]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/version", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_sigterm_exits_0_after_its_server_stopped() -> None:
    port = free_port()
    env = os.environ | {"PYTHONPATH": str(REPO), "GPUHEALTH_MOCK_OLLAMA__PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "services.mock_ollama"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url), 60, "the mock to answer")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        proc.kill()
    assert '"msg": "stopped"' in out

"""The LLM monitor stopped by SIGTERM right after a proxied request: exit 0, its session published."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from evaluation.pipeline import wait_until
from services.mock_ollama.server import MockOllamaServer
from shared.config import KafkaSettings
from tests.integration.kafka_helpers import consume_all

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture
def ollama() -> Iterator[MockOllamaServer]:
    with MockOllamaServer("127.0.0.1", 0, time_scale=0.02) as server:
        server.start()
        yield server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/version", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_sigterm_after_a_request_exits_0_with_its_session_published(
    ollama: MockOllamaServer, kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic, port = topic_factory(prefix="llm"), free_port()
    env = os.environ | {
        "PYTHONPATH": str(REPO), "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_TOPICS__LLM_SESSIONS": topic, "GPUHEALTH_LLM__OLLAMA_URL": ollama.url,
        "GPUHEALTH_LLM__LISTEN_PORT": str(port), "GPUHEALTH_LLM__METRICS_PORT": "0",
        "GPUHEALTH_LLM__POLL_INTERVAL_S": "3600", "GPUHEALTH_LLM__MONITOR_ID": "lifecycle-test",
    }  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "services.llm_monitor"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    proxy = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(proxy), 60, "the proxy to answer")
        reply = httpx.post(
            f"{proxy}/api/generate", json={"model": "qwen2.5:0.5b", "prompt": "hi"}, timeout=60
        )
        assert reply.status_code == 200
        proc.send_signal(signal.SIGTERM)  # the session is queued, not yet delivered
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        proc.kill()
    kinds = [json.loads(m.value() or b"")["kind"] for m in consume_all(kafka_settings, topic, expected=2)]
    assert sorted(kinds) == ["server", "session"]  # the first poll's snapshot, and the request

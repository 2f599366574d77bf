"""The LLM monitor stopped by SIGTERM right after a proxied request: exit 0, its session published."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from evaluation.pipeline import wait_until
from services.mock_ollama.server import MockOllamaServer
from shared.settings.common import KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.service_process import ollama_answers, service_process, sigterm


@pytest.fixture
def ollama() -> Iterator[MockOllamaServer]:
    with MockOllamaServer("127.0.0.1", 0, time_scale=0.02) as server:
        server.start()
        yield server


def test_sigterm_after_a_request_exits_0_with_its_session_published(
    ollama: MockOllamaServer,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
    free_tcp_port: int,
) -> None:
    topic, port = topic_factory(prefix="llm"), free_tcp_port
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_TOPICS__LLM_SESSIONS": topic, "GPUHEALTH_LLM__OLLAMA_URL": ollama.url,
        "GPUHEALTH_LLM__LISTEN_PORT": str(port), "GPUHEALTH_LLM__METRICS_PORT": "0",
        "GPUHEALTH_LLM__POLL_INTERVAL_S": "3600", "GPUHEALTH_LLM__MONITOR_ID": "lifecycle-test",
    }  # fmt: skip
    proxy = f"http://127.0.0.1:{port}"
    with service_process("llm_monitor", env) as proc:
        wait_until(lambda: ollama_answers(proxy), 60, "the proxy to answer")
        reply = httpx.post(
            f"{proxy}/api/generate", json={"model": "qwen2.5:0.5b", "prompt": "hi"}, timeout=60
        )
        assert reply.status_code == 200
        sigterm(proc)  # the session is queued, not yet delivered
    kinds = [json.loads(m.value() or b"")["kind"] for m in consume_all(kafka_settings, topic, expected=2)]
    assert sorted(kinds) == ["server", "session"]  # the first poll's snapshot, and the request

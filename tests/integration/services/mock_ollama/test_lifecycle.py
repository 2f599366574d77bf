"""The mock Ollama stopped by SIGTERM: exit 0, through its lifecycle."""

from __future__ import annotations

from evaluation.pipeline import wait_until
from tests.helpers.service_process import ollama_answers, service_process, sigterm


def test_sigterm_exits_0_after_its_server_stopped(free_tcp_port: int) -> None:
    with service_process("mock_ollama", {"GPUHEALTH_MOCK_OLLAMA__PORT": str(free_tcp_port)}) as proc:
        wait_until(lambda: ollama_answers(f"http://127.0.0.1:{free_tcp_port}"), 60, "the mock to answer")
        sigterm(proc)

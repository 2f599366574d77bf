"""MockOllamaServer as a resource: closing before start does not hang, closing twice is safe."""

from __future__ import annotations

from services.mock_ollama.server import MockOllamaServer
from tests.helpers.service_process import serves_until_stopped


def test_a_server_never_started_closes_at_once_and_twice() -> None:
    with MockOllamaServer("127.0.0.1", 0) as mock:
        pass
    mock.stop()
    assert mock.httpd.socket.fileno() == -1


def test_run_serves_until_stop() -> None:
    with MockOllamaServer("127.0.0.1", 0) as mock:
        serves_until_stopped(mock.run, f"{mock.url}/api/version")

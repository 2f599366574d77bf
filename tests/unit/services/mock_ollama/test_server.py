"""MockOllamaServer as a resource: closing before start does not hang, closing twice is safe."""

from __future__ import annotations

import threading

import httpx

from services.mock_ollama.server import MockOllamaServer


def test_a_server_never_started_closes_at_once_and_twice() -> None:
    with MockOllamaServer("127.0.0.1", 0) as mock:
        pass
    mock.stop()
    assert mock.httpd.socket.fileno() == -1


def test_run_serves_until_stop() -> None:
    stop = threading.Event()
    with MockOllamaServer("127.0.0.1", 0) as mock:
        thread = threading.Thread(target=mock.run, args=(stop,))
        thread.start()
        assert httpx.get(f"{mock.url}/api/version", timeout=5).status_code == 200
        stop.set()
        thread.join(10)
        assert not thread.is_alive()

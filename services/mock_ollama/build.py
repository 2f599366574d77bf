"""The stand-in Ollama its settings describe: the service `python -m services.mock_ollama` runs."""

from __future__ import annotations

import logging

from shared.plumbing.running import Loop, ServiceRun, stopped

from .server import MockOllamaServer
from .settings import MockOllamaSettings

log = logging.getLogger("services.mock_ollama")


class MockOllamaService:
    """Serves the stand-in Ollama on its port until SIGTERM."""

    def __init__(self, settings: MockOllamaSettings) -> None:
        self.cfg = settings.mock_ollama

    def start(self, life: ServiceRun) -> Loop:
        cfg = self.cfg
        server = life.enter_context(MockOllamaServer(cfg.host, cfg.port, time_scale=cfg.time_scale))
        log.info("serving", extra={"url": server.url, "time_scale": cfg.time_scale})
        return server

    def stopped(self) -> int:
        return stopped(log)

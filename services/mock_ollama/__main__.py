"""`python -m services.mock_ollama`: serve the mock Ollama until SIGTERM (GPUHEALTH_MOCK_OLLAMA__*)."""

from __future__ import annotations

import logging
import sys

from pydantic import Field

from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service
from shared.settings.common import Section, Settings

from .server import MockOllamaServer

log = logging.getLogger("services.mock_ollama")


class MockOllamaSection(Section):
    """GPUHEALTH_MOCK_OLLAMA__*: the stand-in Ollama."""

    host: str = "127.0.0.1"
    """Address the stand-in Ollama listens on."""
    port: int = Field(default=11434, ge=0, le=65535)
    """Port the stand-in Ollama listens on (Ollama's own)."""
    time_scale: float = Field(default=1.0, ge=0, le=100)
    """Its models' load, prompt and generation times are nominal times multiplied by this (0: no waits)."""


class MockOllamaSettings(Settings):
    mock_ollama: MockOllamaSection = Field(default_factory=MockOllamaSection)


def main() -> int:
    settings = start_service(MockOllamaSettings, "mock-ollama")
    if settings is None:
        return 2
    cfg = settings.mock_ollama
    with ServiceRun("mock-ollama", settings.shutdown) as life:
        try:
            server = life.enter_context(MockOllamaServer(cfg.host, cfg.port, time_scale=cfg.time_scale))
        except OSError as e:
            log.error("mock Ollama cannot start: %s", e)
            return 1
        log.info("serving", extra={"url": server.url, "time_scale": cfg.time_scale})
        server.run(life.stop)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

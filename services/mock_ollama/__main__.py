"""`python -m services.mock_ollama`: serve the mock Ollama until SIGTERM (GPUHEALTH_MOCK_OLLAMA__*)."""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import MockOllamaService
from .settings import MockOllamaSettings

log = logging.getLogger("services.mock_ollama")


def main() -> int:
    return run_service(
        MockOllamaSettings, "mock-ollama", MockOllamaService, log=log, cannot_start="mock Ollama cannot start"
    )


if __name__ == "__main__":
    sys.exit(main())

"""`python -m services.llm_monitor`: the Ollama proxy, server polls and the probe, publishing to llm-sessions.

Clients talk to the proxy (GPUHEALTH_LLM__LISTEN_PORT, default 11435) as they
would to Ollama (GPUHEALTH_LLM__OLLAMA_URL). Every `poll_interval_s` the
monitor records what Ollama has loaded and, for each of `vllm_urls`, what vLLM
reports. With `probe_model` set, a bounded synthetic request runs every
`probe_interval_s`. Messages are keyed by the server's URL. SIGTERM: stop
accepting, flush, exit 0.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import CANNOT_SERVE, LlmMonitorService
from .settings import LlmSettings

log = logging.getLogger("services.llm_monitor")


def main() -> int:
    return run_service(LlmSettings, "llm-monitor", LlmMonitorService, log=log, cannot_start=CANNOT_SERVE)


if __name__ == "__main__":
    sys.exit(main())

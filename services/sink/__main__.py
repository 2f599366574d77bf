"""`python -m services.sink`: consume gpu-metrics-raw and gpu-events into TimescaleDB until SIGTERM.

Run several with the same GPUHEALTH_SINK__GROUP_ID to share the partitions.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import SinkService
from .settings import SinkSection, SinkSettings

__all__ = ["SinkSection", "SinkSettings", "main"]  # the settings stay importable from here

log = logging.getLogger("services.sink")


def main() -> int:
    return run_service(SinkSettings, "sink", SinkService, log=log)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m services.mock_dcgm`: serve a simulated fleet until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import MockDcgmService
from .settings import MockDcgmSettings

log = logging.getLogger("services.mock_dcgm")


def main() -> int:
    return run_service(
        MockDcgmSettings, "mock_dcgm", MockDcgmService, log=log, cannot_start="cannot start the mock fleet"
    )


if __name__ == "__main__":
    sys.exit(main())

"""`python -m services.api`: serve the query API (uvicorn) until SIGTERM."""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import ApiService
from .settings import ApiSettings

log = logging.getLogger("services.api")


def main() -> int:
    return run_service(ApiSettings, "api", ApiService, log=log)


if __name__ == "__main__":
    sys.exit(main())

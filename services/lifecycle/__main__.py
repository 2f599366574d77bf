"""`python -m services.lifecycle`: decide every GPU's lifecycle on a schedule, and when the inventory changes.

GPUHEALTH_LIFECYCLE__ONCE=true decides once and exits (an operator asking now,
a cron job). docs/services/lifecycle.md says what is decided and how it is priced.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import LifecycleService
from .settings import LifecycleSettings

__all__ = ["LifecycleSettings", "main"]

log = logging.getLogger("services.lifecycle")


def main() -> int:
    return run_service(LifecycleSettings, "lifecycle", LifecycleService, log=log)


if __name__ == "__main__":
    sys.exit(main())

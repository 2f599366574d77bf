"""`python -m services.scorer`: judge a GPU on each of its events, and the fleet every cycle, until SIGTERM.

Run several: they share the fleet by the partitions of gpu-events their
consumer group assigns (services/scorer/ownership.py).

As-of time (GPUHEALTH_SCORER__AS_OF): `now` judges a live fleet against the
wall clock; `latest` judges it as of its newest sample (a replayed fleet, or
the mock running on an accelerated clock); an ISO-8601 time scores that moment
once and exits, for replays and evaluations.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import ScorerService
from .settings import ScorerSection, ScorerSettings

__all__ = ["ScorerSection", "ScorerSettings", "main"]  # the settings stay importable from here

log = logging.getLogger("services.scorer")


def main() -> int:
    return run_service(ScorerSettings, "scorer", ScorerService, log=log)


if __name__ == "__main__":
    sys.exit(main())

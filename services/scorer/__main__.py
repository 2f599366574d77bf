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

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import GpuHealthError
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .loop import FLUSH_TIMEOUT_S, ScorerSection, ScorerSettings, build_scorer

__all__ = ["ScorerSection", "ScorerSettings", "main"]  # the settings stay importable from here

log = logging.getLogger("services.scorer")


def main() -> int:
    settings = start_service(ScorerSettings, "scorer")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    try:
        scorer = build_scorer(settings, registry=registry)
    except GpuHealthError as e:  # the rules file
        log.error("%s", e)
        return 2
    cfg = settings.scorer
    with ServiceRun("scorer", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind, database=settings.db)
        except (GpuHealthError, OSError) as e:
            log.error("scorer cannot start: %s", e)
            return 1
        if scorer.events is not None:
            # Closed in reverse: the event thread is joined, then what it queued is flushed.
            life.callback(scorer.cycle.producer.close, FLUSH_TIMEOUT_S)
            life.start_thread(scorer.events, "scorer-events")
        scorer.cycle.run(life.stop)  # its producer is flushed at the end of run, however it ends
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

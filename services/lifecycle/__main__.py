"""`python -m services.lifecycle`: decide every GPU's lifecycle on a schedule, and when the inventory changes.

GPUHEALTH_LIFECYCLE__ONCE=true decides once and exits (an operator asking now,
a cron job). docs/services/lifecycle.md says what is decided and how it is priced.
"""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .loop import LifecycleLoop
from .settings import LifecycleSettings

__all__ = ["LifecycleSettings", "main"]

log = logging.getLogger("services.lifecycle")


def main() -> int:
    settings = start_service(LifecycleSettings, "lifecycle")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    try:
        loop = LifecycleLoop(
            settings, producer=JsonProducer(make_producer(settings.kafka)), registry=registry
        )
    except GpuHealthError as e:  # the predictor's weights file
        log.error("%s", e)
        return 2
    cfg = settings.lifecycle
    with ServiceRun("lifecycle", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind, database=settings.db)
        except (GpuHealthError, OSError) as e:
            log.error("lifecycle cannot start: %s", e)
            return 1
        loop.run(life.stop)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

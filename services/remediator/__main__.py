"""`python -m services.remediator`: act on verdicts per the policy; dry-run unless told otherwise.

Exit status: 0 after SIGTERM/SIGINT (what was in hand finished and recorded),
1 when it cannot start (the /metrics port, the database), 2 for invalid
settings, policy, node map or kubeconfig.
"""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import GpuHealthError
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .build import build_remediator
from .settings import RemediatorSettings

log = logging.getLogger("services.remediator")


def main() -> int:
    settings = start_service(RemediatorSettings, "remediator")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    try:
        loop = build_remediator(settings, registry=registry)
    except GpuHealthError as e:  # the policy, the node map, a driver's settings
        log.error("%s", e)
        return 2
    cfg = settings.remediator
    if cfg.dry_run:
        log.info("dry run: every decision and step is recorded, nothing is carried out")
    with ServiceRun("remediator", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind, database=settings.db)
        except (GpuHealthError, OSError) as e:
            log.error("remediator cannot start: %s", e)
            loop.close_unstarted()
            return 1
        loop.run(life.stop)  # the producer is flushed and the consumer closed however it ends
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

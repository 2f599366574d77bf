"""`python -m services.sink`: consume gpu-metrics-raw and gpu-events into TimescaleDB until SIGTERM.

Run several with the same GPUHEALTH_SINK__GROUP_ID to share the partitions.
"""

from __future__ import annotations

import gc
import logging
import sys
from contextlib import closing
from datetime import timedelta

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import closing_consumer
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .build import build_sink_loop, build_verification_loop, sink_loop_closed
from .metrics import SinkMetrics
from .retention import Retention
from .rollup import RollupRefresher
from .settings import SinkSection, SinkSettings
from .workload import WorkloadLoop

__all__ = ["SinkSection", "SinkSettings", "main"]  # the settings stay importable from here

log = logging.getLogger("services.sink")


def main() -> int:
    settings = start_service(SinkSettings, "sink")
    if settings is None:
        return 2
    cfg = settings.sink
    registry = CollectorRegistry()
    metrics = SinkMetrics(registry)
    with ServiceRun("sink", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind, database=settings.db)
        except (GpuHealthError, OSError) as e:
            log.error("sink cannot start: %s", e)
            return 1
        # Closed by this stack once the loops have ended, the last entered first.
        retention = life.enter_context(closing(Retention(
            settings.db, metrics, keep_raw_days=cfg.keep_raw_days, keep_events_days=cfg.keep_events_days,
            keep_rollup_days=cfg.keep_rollup_days, interval_s=cfg.retention_interval_s,
            archive_dir=cfg.archive_dir, archive_block_kib=cfg.archive_block_kib,
            archive_zstd_level=cfg.archive_zstd_level,
        )))  # fmt: skip
        loop = life.enter_context(sink_loop_closed(build_sink_loop(
            settings.kafka, settings.db, settings.topics, cfg, metrics=metrics, housekeeping=retention,
            rollup=RollupRefresher(
                settings.db, metrics, interval_s=cfg.rollup_refresh_s, caught_up_s=cfg.rollup_caught_up_s,
                keep_raw=timedelta(days=cfg.keep_raw_days), statement_timeout_ms=cfg.statement_timeout_ms,
                complete_for=(cfg.group_id, settings.topics.metrics_raw),
            ),
        )))  # fmt: skip
        # gpu-verifications and gpu-systems: a small loop of their own (services/sink/verifications.py)
        verification = build_verification_loop(
            settings.kafka, settings.db, settings.topics, cfg, metrics=metrics
        )
        life.enter_context(closing_consumer(verification.consumer))
        # The sink allocates ~100 short-lived objects a message. Startup objects are frozen out
        # of the collector's way, and young collections run every 50k allocations rather than
        # 700: measured ~2 µs less CPU a message. Nothing here builds reference cycles.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        # gpu-processes and llm-sessions: the same family loop over theirs (services/sink/workload.py)
        workload = life.enter_context(
            WorkloadLoop.from_settings(settings, group_id=cfg.group_id, metrics=metrics)
        )
        life.start_thread(workload, "sink-workload")
        life.start_thread(verification, "sink-records")
        log.info("sinking", extra={"topics": settings.topics.stored_by("metrics")})
        loop.run(life.stop)
    if verification.failed or workload.failed:
        log.error("stopped: a records loop failed")
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

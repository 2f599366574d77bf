"""The lifecycle service its settings describe: the loop, its producer and its /metrics
(`python -m services.lifecycle`)."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import Loop, ServiceRun, stopped

from .loop import LifecycleLoop
from .settings import LifecycleSettings

log = logging.getLogger("services.lifecycle")


class LifecycleService:
    """Decides every GPU's lifecycle on a schedule (once, with `once`), once the database is there."""

    def __init__(self, settings: LifecycleSettings) -> None:
        """GpuHealthError for the predictor's weights or calibration file."""
        self.settings = settings
        self.registry = CollectorRegistry()
        self.loop = LifecycleLoop(
            settings, producer=JsonProducer(make_producer(settings.kafka)), registry=self.registry
        )

    def start(self, life: ServiceRun) -> Loop:
        cfg = self.settings.lifecycle
        life.serve_metrics(self.registry, cfg.metrics_port, cfg.metrics_bind, database=self.settings.db)
        return self.loop

    def stopped(self) -> int:
        return stopped(log)

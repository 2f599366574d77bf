"""The LLM monitor its settings describe: the service `python -m services.llm_monitor` runs."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import Loop, ServiceRun, stopped

from .monitor import Monitor
from .settings import LlmSettings

log = logging.getLogger("services.llm_monitor")

CANNOT_SERVE = "llm monitor cannot serve"


class LlmMonitorService:
    """The monitor, its producer and its /metrics; a port it cannot listen on ends it with exit status 1."""

    def __init__(self, settings: LlmSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.serving: Serving | None = None

    def start(self, life: ServiceRun) -> Loop:
        settings = self.settings
        life.serve_metrics(self.registry, settings.llm.metrics_port, settings.llm.metrics_bind)
        producer = life.enter_context(
            JsonProducer(make_producer(settings.kafka, {"client.id": f"{settings.kafka.client_id}-llm"}))
        )
        self.serving = Serving(Monitor(settings, producer, self.registry))
        return self.serving

    def stopped(self) -> int:
        if self.serving is not None and self.serving.failed:
            return 1
        return stopped(log)


@dataclass(slots=True)
class Serving:
    """Runs the monitor; the proxy's port taken is said (`CANNOT_SERVE`) and remembered, not raised."""

    monitor: Monitor
    failed: bool = field(default=False)

    def run(self, stop: threading.Event) -> None:
        try:
            self.monitor.run(stop)
        except OSError as e:  # the proxy's port
            log.error("%s: %s", CANNOT_SERVE, e)
            self.failed = True

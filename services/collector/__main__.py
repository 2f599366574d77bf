"""`python -m services.collector`: poll this node's GPUs and publish to Kafka until SIGTERM.

Source choice (GPUHEALTH_COLLECTOR__SOURCE): `dcgm` scrapes dcgm-exporter at
each of `dcgm_urls`; `mock` is the same against the mock fleet (samples say
source=mock); `nvml` and `smi` read the local GPUs; `auto` tries a reachable
dcgm-exporter, then NVML, then nvidia-smi, in that order.
"""

from __future__ import annotations

import logging
import shutil
import socket
import sys
from pathlib import Path
from typing import Literal

import httpx
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from shared.config import Settings
from shared.errors import GpuHealthError
from shared.kafka import JsonProducer
from shared.models import Source
from shared.service import serve_metrics, start_service, stop_on_signals

from .dcgm_source import DcgmSource
from .enrich import Enricher, Placement, load_inventory
from .events import EventDetector
from .metrics import CollectorMetrics
from .nvml_source import NvmlSource
from .poller import Collector
from .processes import ProcessSection, start_process_watch
from .publisher import Publisher, collector_producer
from .readings import GpuSource, SourceError
from .smi_source import SmiSource

log = logging.getLogger("services.collector")


class CollectorSection(BaseModel):
    """GPUHEALTH_COLLECTOR__*"""

    source: Literal["auto", "dcgm", "mock", "nvml", "smi"] = "auto"
    # One collector can read several exporters (e.g. every node of the mock fleet).
    dcgm_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9400/metrics"])
    interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    scrape_timeout_s: float = Field(default=5.0, gt=0, le=120)
    collector_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    cluster: str | None = None
    datacenter: str | None = None
    region: str | None = None
    rack: str | None = None
    inventory_file: Path | None = None
    # Messages held while the broker is away (about 1 KiB each) before new ones are dropped.
    max_queued: int = Field(default=500_000, ge=100, le=10_000_000)
    metrics_port: int = Field(default=9500, ge=0, le=65535)
    metrics_bind: str = "127.0.0.1"


class CollectorSettings(Settings):
    collector: CollectorSection = Field(default_factory=CollectorSection)
    processes: ProcessSection = Field(default_factory=ProcessSection)


def make_sources(cfg: CollectorSection) -> list[GpuSource]:
    if cfg.source in ("dcgm", "mock"):
        kind = Source.MOCK if cfg.source == "mock" else Source.DCGM
        return [DcgmSource(url, kind=kind, timeout_s=cfg.scrape_timeout_s) for url in cfg.dcgm_urls]
    if cfg.source == "nvml":
        return [NvmlSource()]
    if cfg.source == "smi":
        return [SmiSource()]
    # auto: the first that answers
    try:
        if httpx.get(cfg.dcgm_urls[0], timeout=cfg.scrape_timeout_s).status_code == 200:
            log.info("auto: using dcgm-exporter", extra={"urls": cfg.dcgm_urls})
            return [DcgmSource(url, timeout_s=cfg.scrape_timeout_s) for url in cfg.dcgm_urls]
    except httpx.HTTPError:
        pass
    try:
        source: GpuSource = NvmlSource()
        log.info("auto: using NVML")
        return [source]
    except (SourceError, ImportError, OSError):
        pass
    if shutil.which("nvidia-smi"):
        log.info("auto: using nvidia-smi")
        return [SmiSource()]
    raise SourceError("no GPU source found: no dcgm-exporter answered, NVML and nvidia-smi are absent")


def main() -> int:
    settings = start_service(CollectorSettings, "collector")
    if settings is None:
        return 2
    cfg = settings.collector
    registry = CollectorRegistry()
    metrics = CollectorMetrics(registry)
    try:
        inventory = load_inventory(cfg.inventory_file) if cfg.inventory_file else {}
        sources = make_sources(cfg)
        stop_metrics = serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind)
    except (GpuHealthError, OSError) as e:
        log.error("collector cannot start: %s", e)
        return 1
    producer = JsonProducer(collector_producer(settings.kafka, cfg.max_queued))
    publisher = Publisher(producer, metrics)
    enricher = Enricher(
        collector_id=cfg.collector_id,
        local_hostname=socket.gethostname(),
        placement=Placement(cluster=cfg.cluster, datacenter=cfg.datacenter, region=cfg.region, rack=cfg.rack),
        inventory=inventory,
        on_invalid=lambda field: metrics.invalid.labels(field).inc(),
    )
    collector = Collector(
        sources=sources,
        enricher=enricher,
        detector=EventDetector(collector_id=cfg.collector_id),
        publisher=publisher,
        topics=settings.topics,
        metrics=metrics,
        interval_s=cfg.interval_s,
    )
    stop = stop_on_signals()
    start_process_watch(settings.processes, collector_source=cfg.source, dcgm_urls=cfg.dcgm_urls,
                        timeout_s=cfg.scrape_timeout_s, publisher=publisher, topics=settings.topics,
                        collector_id=cfg.collector_id, stop=stop)  # fmt: skip
    log.info("collecting", extra={"sources": [s.target for s in sources], "interval_s": cfg.interval_s})
    try:
        collector.run(stop)
    finally:
        remaining = publisher.flush(30)
        if remaining:
            log.error("exiting with undelivered messages", extra={"undelivered": remaining})
        for source in sources:
            source.close()
        stop_metrics()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

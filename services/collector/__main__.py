"""`python -m services.collector`: poll this node's GPUs and publish to Kafka until SIGTERM.

Source choice (GPUHEALTH_COLLECTOR__SOURCE): `dcgm` scrapes dcgm-exporter at
each of `dcgm_urls`; `mock` is the same against the mock fleet (samples say
source=mock); `nvml` and `smi` read the local GPUs; `auto` tries a reachable
dcgm-exporter, then NVML, then nvidia-smi, in that order.

GPUHEALTH_COLLECTOR__KERNEL_LOG (`off`, `auto`, `kmsg`, `journal`; default
`off`) adds the kernel log as a second place XIDs come from, beside any source:
it must be this host's log, so it suits nvml/smi/a local dcgm-exporter, not a
collector scraping other nodes. Where it cannot be read the collector says so
and runs without it.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Literal

import httpx
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from shared import otlp
from shared.config import Settings
from shared.errors import GpuHealthError
from shared.models import Source
from shared.service import serve_metrics, start_service, stop_on_signals

from .dcgm_source import DcgmSource
from .enrich import Enricher, Placement, load_inventory
from .events import EventDetector
from .gpu_otlp import GpuInstruments
from .kernel_log import XidFeed, open_kernel_log
from .metrics import CollectorMetrics
from .nvml_source import NvmlSource
from .poller import Collector
from .processes import ProcessSection, start_process_watch
from .publisher import Publisher, collector_producer
from .readings import GpuSource, SourceError
from .smi_source import SmiSource
from .spool import SpoolFile, SpoolingProducer, delivered_already
from .systems import local_identity, start_announcer

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
    kernel_log: Literal["off", "auto", "kmsg", "journal"] = "off"
    # NVML/smi nodes: how often identity is re-read for gpu-systems (0: only at start)
    systems_interval_s: float = Field(default=300.0, ge=0, le=86_400)
    # At shutdown, how long the broker gets to take what is queued; the rest is spooled to
    # spool_path (default: ~/.cache/gpu-health/spool/collector-<collector_id>.jsonl), at most
    # spool_max_bytes (beyond it, the newest are dropped and logged), and sent first at the next start.
    shutdown_flush_s: float = Field(default=5.0, ge=0, le=600)
    spool_path: Path | None = None
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=4096, le=64 * 1024**3)
    # Before resending, how long to read Kafka back for spooled messages it already has.
    spool_check_timeout_s: float = Field(default=15.0, gt=0, le=600)

    def spool_file(self) -> Path:
        if self.spool_path is not None:
            return self.spool_path
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.collector_id)
        return Path.home() / ".cache" / "gpu-health" / "spool" / f"collector-{name}.jsonl"


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


def make_xid_feeds(cfg: CollectorSection) -> list[XidFeed]:
    if cfg.kernel_log == "off":
        return []
    try:
        feed = open_kernel_log(cfg.kernel_log)
    except SourceError as e:
        log.warning("kernel log XIDs off: %s", e)
        return []
    log.info("reading XIDs from the kernel log", extra={"feed": feed.name})
    return [feed]


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
    producer = SpoolingProducer(collector_producer(settings.kafka, cfg.max_queued))
    publisher = Publisher(producer, metrics, SpoolFile(cfg.spool_file(), cfg.spool_max_bytes))
    enricher = Enricher(
        collector_id=cfg.collector_id,
        local_hostname=socket.gethostname(),
        placement=Placement(cluster=cfg.cluster, datacenter=cfg.datacenter, region=cfg.region, rack=cfg.rack),
        inventory=inventory,
        on_invalid=lambda field: metrics.invalid.labels(field).inc(),
    )
    gpu_meter = otlp.meter("gpuhealth.collector")  # None unless OTLP export is on
    collector = Collector(
        sources=sources,
        enricher=enricher,
        detector=EventDetector(collector_id=cfg.collector_id, local_hostname=socket.gethostname()),
        publisher=publisher,
        topics=settings.topics,
        metrics=metrics,
        interval_s=cfg.interval_s,
        xid_feeds=(feeds := make_xid_feeds(cfg)),
        on_samples=GpuInstruments(gpu_meter).observe if gpu_meter else None,
    )
    stop = stop_on_signals()
    start_process_watch(settings.processes, collector_source=cfg.source, dcgm_urls=cfg.dcgm_urls,
                        timeout_s=cfg.scrape_timeout_s, publisher=publisher, topics=settings.topics,
                        collector_id=cfg.collector_id, stop=stop)  # fmt: skip
    if sources[0].kind in (Source.NVML, Source.SMI):  # this node's own GPUs: announce its identity
        start_announcer(
            read=local_identity(cfg.collector_id),
            publisher=publisher,
            topic=settings.topics.systems,
            interval_s=cfg.systems_interval_s,
            stop=stop,
        )
    log.info("collecting", extra={"sources": [s.target for s in sources], "interval_s": cfg.interval_s})
    try:
        # What the last run could not deliver goes first, but not what the broker has already.
        publisher.resume(
            lambda pending: delivered_already(settings.kafka, pending, cfg.spool_check_timeout_s)
        )
        collector.run(stop)
    finally:
        publisher.close(cfg.shutdown_flush_s)
        for source in sources:
            source.close()
        for feed in feeds:
            feed.close()
        stop_metrics()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

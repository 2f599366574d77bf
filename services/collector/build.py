"""The collector's object graph, assembled once: for `main`, the evaluation, the benches and the tests.

`build_collector` wires sources, enricher, event detector and publisher into a
:class:`~services.collector.poller.Collector` from the collector's settings;
callers hand in what they replace (a producer writing to a test's list, a
mock fleet's sources, a hand-moved clock). The collector it returns is a
context manager that closes all of it once.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, Field

from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import GpuSource, SourceError
from gpuhealth.gpu.smi_source import SmiSource
from shared.config import Settings, TopicSettings
from shared.models import GpuSample, Source

from .dcgm_source import DcgmSource
from .enrich import Enricher, Placement, load_inventory
from .events import EventDetector
from .kernel_log import XidFeed, open_kernel_log
from .metrics import CollectorMetrics
from .poller import Collector
from .processes import ProcessSection
from .publisher import Producer, Publisher
from .spool import SpoolFile

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


def build_collector(
    cfg: CollectorSection,
    topics: TopicSettings,
    *,
    producer: Producer,
    metrics: CollectorMetrics,
    sources: Sequence[GpuSource] | None = None,
    spool: SpoolFile | None = None,
    xid_feeds: Sequence[XidFeed] | None = None,
    local_hostname: str | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    on_samples: Callable[[list[GpuSample]], None] | None = None,
) -> Collector:
    """The collector `cfg` describes, publishing through `producer`.

    Sources and kernel-log feeds come from `cfg` unless given; the inventory file is read
    here (ConfigError when it cannot be). Raises SourceError when no source answers.
    """
    inventory = load_inventory(cfg.inventory_file) if cfg.inventory_file else {}
    hostname = socket.gethostname() if local_hostname is None else local_hostname
    publisher = Publisher(producer, metrics, spool)
    return Collector(
        sources=make_sources(cfg) if sources is None else sources,
        enricher=Enricher(
            collector_id=cfg.collector_id,
            local_hostname=hostname,
            placement=Placement(
                cluster=cfg.cluster, datacenter=cfg.datacenter, region=cfg.region, rack=cfg.rack
            ),
            inventory=inventory,
            on_invalid=lambda field: metrics.invalid.labels(field).inc(),
        ),
        # Feeds read from cfg are this host's kernel log: their XIDs go to this host's GPUs only.
        # Feeds handed in (recorded logs) are matched to any host's GPUs.
        detector=EventDetector(
            collector_id=cfg.collector_id, local_hostname=hostname if xid_feeds is None else None
        ),
        publisher=publisher,
        topics=topics,
        metrics=metrics,
        interval_s=cfg.interval_s,
        monotonic=monotonic,
        xid_feeds=make_xid_feeds(cfg) if xid_feeds is None else xid_feeds,
        on_samples=on_samples,
        shutdown_flush_s=cfg.shutdown_flush_s,
    )

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
from pydantic import Field

from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import GpuSource, SourceError
from gpuhealth.gpu.smi_source import SmiSource
from shared.contract.models import GpuSample, Source
from shared.settings.common import Section, Settings, TopicSettings

from .dcgm_source import DcgmSource
from .enrich import Enricher, Placement, load_inventory
from .events import EventDetector
from .kernel_log import JournalFeed, XidFeed, mock_journal, open_kernel_log
from .metrics import CollectorMetrics
from .poller import Collector
from .processes import ProcessSection
from .publisher import Producer, Publisher
from .spool import SpoolFile

log = logging.getLogger("services.collector")


class CollectorSection(Section):
    """GPUHEALTH_COLLECTOR__*: what the collector reads, how often, where the node is, and its spool."""

    source: Literal["auto", "dcgm", "mock", "nvml", "smi"] = "auto"
    """`dcgm` (dcgm-exporter over HTTP), `mock` (the same, samples say `source: mock`), `nvml`, `smi`
    (nvidia-smi), or `auto`: dcgm-exporter if it answers, else NVML, else nvidia-smi."""
    dcgm_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9400/metrics"])
    """The exporters to scrape: one collector can read several (e.g. every node of the mock fleet)."""
    interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    """Poll period; polls tick on a monotonic schedule and skip (and count) ticks they overran."""
    scrape_timeout_s: float = Field(default=5.0, gt=0, le=120)
    """How long one scrape of an exporter may take."""
    collector_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    """Names the collector in every message (and its spool file)."""
    cluster: str | None = None
    """This node's cluster."""
    datacenter: str | None = None
    """This node's datacenter."""
    region: str | None = None
    """This node's region."""
    rack: str | None = None
    """This node's rack."""
    inventory_file: Path | None = None
    """A CSV `hostname,rack,datacenter,cluster,region`; it wins over the settings for the hosts it lists."""
    max_queued: int = Field(default=500_000, ge=100, le=10_000_000)
    """Messages held while the broker is away (about 1 KiB each); beyond it new ones are dropped, counted
    and logged."""
    metrics_port: int = Field(default=9500, ge=0, le=65535)
    """Port of the collector's own `/metrics`."""
    metrics_bind: str = "127.0.0.1"
    """Address of the collector's own `/metrics`."""
    kernel_log: Literal["off", "auto", "kmsg", "journal", "mock"] = "off"
    """Also read XIDs from this host's kernel log (`/dev/kmsg` or `journalctl`), beside any source; `mock`:
    each mock fleet node's (`/journal` beside each of `dcgm_urls`)."""
    xid_fold_s: float = Field(default=10.0, ge=0, le=3600)
    """Repeats of one XID on one GPU within this many seconds of its first line are one event, published
    at once and again when the window ends with the exact count and the last line's time (0: every line
    its own event)."""
    systems_interval_s: float = Field(default=300.0, ge=0, le=86_400)
    """NVML and nvidia-smi nodes: how often identity is re-read for `gpu-systems` (0: only at start)."""
    shutdown_flush_s: float = Field(default=5.0, ge=0, le=600)
    """On SIGTERM, how long the broker gets to take what is queued before the rest is spooled."""
    spool_path: Path | None = None
    """Where what the broker did not take at shutdown is kept, to be sent first at the next start;
    unset: `~/.cache/gpu-health/spool/collector-<collector_id>.jsonl`."""
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=4096, le=64 * 1024**3)
    """The spool's bound; beyond it the newest messages are dropped, counted and logged."""
    spool_check_timeout_s: float = Field(default=15.0, gt=0, le=600)
    """Before resending the spool, how long to read Kafka back for messages it already has."""

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
    if cfg.kernel_log == "mock":
        feeds: list[XidFeed] = []
        for url in cfg.dcgm_urls:
            try:
                feeds.append(JournalFeed(mock_journal(url, timeout_s=cfg.scrape_timeout_s), hosts=True,
                                         from_start=True))  # fmt: skip
            except SourceError as e:
                log.warning("kernel log XIDs of %s off: %s", url, e)
        return feeds
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
            collector_id=cfg.collector_id,
            local_hostname=hostname if xid_feeds is None else None,
            fold_s=cfg.xid_fold_s,
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

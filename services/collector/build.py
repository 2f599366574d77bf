"""The collector's object graph, assembled once: for `main`, the evaluation, the benches and the tests.

`build_collector` wires sources, enricher, event detector and publisher into a
:class:`~services.collector.poller.Collector` from the collector's settings;
callers hand in what they replace (a producer writing to a test's list, a
mock fleet's sources, a hand-moved clock). The collector it returns is a
context manager that closes all of it once.
"""

from __future__ import annotations

import gc
import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry

from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import GpuSource, SourceError
from gpuhealth.gpu.smi_source import SmiSource
from shared.contract.models import GpuSample, Source
from shared.plumbing import otlp
from shared.plumbing.running import Loop, ServiceRun, stopped
from shared.settings.common import TopicSettings

from .dcgm_source import DcgmSource
from .enrich import Enricher, Placement, load_inventory
from .events import EventDetector
from .gpu_otlp import GpuInstruments
from .kernel_log import JournalFeed, XidFeed, mock_journal, open_kernel_log
from .metrics import CollectorMetrics
from .poller import Collector
from .processes import start_process_watch
from .publisher import Producer, Publisher, collector_producer
from .settings import CollectorSection, CollectorSettings
from .spool import SpoolFile, SpoolingProducer, delivered_already
from .systems import local_identity, start_announcer

log = logging.getLogger("services.collector")


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
                feeds.append(
                    JournalFeed(
                        mock_journal(url, timeout_s=cfg.scrape_timeout_s), hosts=True, from_start=True
                    )
                )
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


class CollectorService:
    """`python -m services.collector`: the collector, its /metrics, the process watch and (on this node's
    own GPUs) the identity announcer."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.metrics = CollectorMetrics(self.registry)
        self.gpu_meter = otlp.meter("gpuhealth.collector")  # None unless OTLP export is on

    def start(self, life: ServiceRun) -> Loop:
        cfg, settings = self.settings.collector, self.settings
        life.serve_metrics(self.registry, cfg.metrics_port, cfg.metrics_bind)
        collector = life.enter_context(
            build_collector(
                cfg,
                settings.topics,
                producer=SpoolingProducer(collector_producer(settings.kafka, cfg.max_queued)),
                metrics=self.metrics,
                spool=SpoolFile(cfg.spool_file(), cfg.spool_max_bytes),
                on_samples=GpuInstruments(self.gpu_meter).observe if self.gpu_meter else None,
            )
        )
        return Collecting(settings, collector, life)

    def stopped(self) -> int:
        return stopped(log)


@dataclass(frozen=True, slots=True)
class Collecting:
    """The started collector's loop: what runs beside it is started with it, and joined by `life`."""

    settings: CollectorSettings
    collector: Collector
    life: ServiceRun

    def run(self, stop: threading.Event) -> None:
        """Start what runs beside the collector, then collect until `stop` is set."""
        life, collector, cfg, settings = self.life, self.collector, self.settings.collector, self.settings
        # Joined (stop set) before the collector flushes what they published: entered after it.
        watch = start_process_watch(
            settings.processes,
            collector_source=cfg.source,
            dcgm_urls=cfg.dcgm_urls,
            timeout_s=cfg.scrape_timeout_s,
            publisher=collector.publisher,
            topics=settings.topics,
            collector_id=cfg.collector_id,
            stop=stop,
        )
        if watch is not None:
            life.callback(watch.join, 30)
        if collector.sources[0].kind in (Source.NVML, Source.SMI):  # this node's GPUs: announce its identity
            announcer = start_announcer(
                read=local_identity(cfg.collector_id),
                publisher=collector.publisher,
                topic=settings.topics.systems,
                interval_s=cfg.systems_interval_s,
                stop=stop,
            )
            life.callback(announcer.join, 30)
        log.info(
            "collecting",
            extra={"sources": [s.target for s in collector.sources], "interval_s": cfg.interval_s},
        )
        # What the last run could not deliver goes first, but not what the broker has already.
        collector.publisher.resume(
            lambda pending: delivered_already(settings.kafka, pending, cfg.spool_check_timeout_s)
        )
        # What is loaded by now lives as long as the process: frozen out of the cyclic GC's sight, a
        # full collection walks only what the polls leave (httpx leaves a few cycles each scrape), so
        # it comes often and cheaply and the resident size stays flat (bench/bench_collector_cost.py).
        gc.freeze()
        collector.run(stop)

"""`python -m services.collector`: poll this node's GPUs and publish to Kafka until SIGTERM.

Source choice (GPUHEALTH_COLLECTOR__SOURCE): `dcgm` scrapes dcgm-exporter at
each of `dcgm_urls`; `mock` is the same against the mock fleet (samples say
source=mock); `nvml` and `smi` read the local GPUs; `auto` tries a reachable
dcgm-exporter, then NVML, then nvidia-smi, in that order.

GPUHEALTH_COLLECTOR__KERNEL_LOG (`off`, `auto`, `kmsg`, `journal`, `mock`; default
`off`) adds the kernel log as a second place XIDs come from, beside any source:
it must be this host's log, so it suits nvml/smi/a local dcgm-exporter, not a
collector scraping other nodes (`mock`: each mock fleet node's own, as `make up`
reads them). Where it cannot be read the collector says so and runs without it.
"""

from __future__ import annotations

import gc
import logging
import sys

from prometheus_client import CollectorRegistry

from shared.contract.models import Source
from shared.plumbing import otlp
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .build import CollectorSettings, build_collector
from .gpu_otlp import GpuInstruments
from .metrics import CollectorMetrics
from .processes import start_process_watch
from .publisher import collector_producer
from .spool import SpoolFile, SpoolingProducer, delivered_already
from .systems import local_identity, start_announcer

__all__ = ["CollectorSettings", "main"]  # the settings stay importable from here (compose checks)

log = logging.getLogger("services.collector")


def main() -> int:
    settings = start_service(CollectorSettings, "collector")
    if settings is None:
        return 2
    cfg = settings.collector
    registry = CollectorRegistry()
    metrics = CollectorMetrics(registry)
    gpu_meter = otlp.meter("gpuhealth.collector")  # None unless OTLP export is on
    with ServiceRun("collector", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, cfg.metrics_port, cfg.metrics_bind)
            collector = life.enter_context(
                build_collector(
                    cfg,
                    settings.topics,
                    producer=SpoolingProducer(collector_producer(settings.kafka, cfg.max_queued)),
                    metrics=metrics,
                    spool=SpoolFile(cfg.spool_file(), cfg.spool_max_bytes),
                    on_samples=GpuInstruments(gpu_meter).observe if gpu_meter else None,
                )
            )
        except (GpuHealthError, OSError) as e:
            log.error("collector cannot start: %s", e)
            return 1
        # Joined (stop set) before the collector flushes what they published: entered after it.
        watch = start_process_watch(
            settings.processes, collector_source=cfg.source, dcgm_urls=cfg.dcgm_urls,
            timeout_s=cfg.scrape_timeout_s, publisher=collector.publisher, topics=settings.topics,
            collector_id=cfg.collector_id, stop=life.stop,
        )  # fmt: skip
        if watch is not None:
            life.callback(watch.join, 30)
        if collector.sources[0].kind in (Source.NVML, Source.SMI):  # this node's GPUs: announce its identity
            announcer = start_announcer(
                read=local_identity(cfg.collector_id),
                publisher=collector.publisher,
                topic=settings.topics.systems,
                interval_s=cfg.systems_interval_s,
                stop=life.stop,
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
        collector.run(life.stop)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Collector cost: CPU time per GPU-sample for scrape+parse+enrich+publish, next to parse alone.

A mock fleet serves over HTTP; the collector reads it and publishes to the real
broker (a scratch topic). The baseline is prometheus_client parsing the same
pages, measured in the same run: the ratio says what the rest of the pipeline
(HTTP, validation, JSON, Kafka) adds on top of the unavoidable parse.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bench._common import report, scratch_topic
from services.collector.build import build_collector
from services.collector.dcgm_source import DcgmSource
from services.collector.metrics import CollectorMetrics
from services.collector.publisher import collector_producer
from services.collector.settings import CollectorSection
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from shared.plumbing.kafka import JsonProducer, wait_for_kafka
from shared.settings.common import Settings, TopicSettings


def cpu(fn: object, rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        fn()  # type: ignore[operator]
    return (time.process_time() - start) / rounds


def measure(settings: Settings, nodes: int, rounds: int) -> None:
    gpus = nodes * 8
    fleet = Fleet(FleetSpec(nodes=nodes, gpus_per_node=8, seed=5), SimClock(start_s=time.time()))
    server = MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False)
    server.start()
    try:
        with scratch_topic(settings.kafka) as topic:
            collector = build_collector(
                CollectorSection(collector_id="bench", interval_s=1),
                TopicSettings(metrics_raw=topic, events=topic),
                producer=JsonProducer(collector_producer(settings.kafka, 1_000_000)),
                metrics=CollectorMetrics(CollectorRegistry()),
                sources=[DcgmSource(server.node_url(i)) for i in range(nodes)],
                local_hostname="bench",
            )
            publisher = collector.publisher
            collector.poll_once()  # warm: connections, topic metadata
            pages = [fleet.scrape(i, timestamps=False)[0] for i in range(nodes)]

            def full() -> None:
                collector.poll_once()

            def parse() -> None:
                for page in pages:
                    for _ in text_string_to_metric_families(page):
                        pass

            t_full = cpu(full, rounds) / gpus * 1e6
            publisher.flush(60)
            t_parse = cpu(parse, rounds) / gpus * 1e6
            collector.close()
    finally:
        server.stop()
    # The mock renders its pages in this same process; that CPU is not the collector's.
    report(f"{gpus} GPUs: CPU us per GPU-sample, scrape+parse+publish (incl. mock render)",
           t_full, "us", "parse only", t_parse)  # fmt: skip


def main() -> int:
    settings = Settings()
    wait_for_kafka(settings.kafka)
    measure(settings, nodes=1, rounds=30)
    measure(settings, nodes=128, rounds=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

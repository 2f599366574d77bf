"""build_collector: the graph from settings, closed once (flush, then sources and feeds)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from services.collector.build import build_collector
from services.collector.metrics import CollectorMetrics
from services.collector.settings import CollectorSection
from shared.contract.models import Source
from shared.settings.common import TopicSettings


class Closeable:
    kind, target, name = Source.MOCK, "http://n1:9400/metrics", "kmsg"

    def __init__(self, log: list[str], label: str) -> None:
        self.log, self.label = log, label

    def close(self) -> None:
        self.log.append(f"close {self.label}")


class Producer:
    def __init__(self, log: list[str]) -> None:
        self.log, self.delivered, self.failed = log, 0, 0

    def flush(self, timeout_s: float = 30.0) -> int:
        self.log.append(f"flush {timeout_s:g}")
        return 0


def test_the_collector_flushes_then_closes_what_it_holds_once() -> None:
    log: list[str] = []
    source: Any = Closeable(log, "source")
    feed: Any = Closeable(log, "feed")
    producer: Any = Producer(log)
    cfg = CollectorSection(collector_id="c-1", cluster="prod", interval_s=5, shutdown_flush_s=2.5)
    with build_collector(
        cfg, TopicSettings(), producer=producer, metrics=CollectorMetrics(CollectorRegistry()),
        sources=[source], xid_feeds=[feed], local_hostname="here",
    ) as collector:  # fmt: skip
        assert (collector.interval_s, collector.enricher.placement.cluster) == (5, "prod")
        assert collector.detector.local_hostname is None  # feeds handed in: not this host's log
    collector.close()
    assert log == ["flush 2.5", "close source", "close feed"]

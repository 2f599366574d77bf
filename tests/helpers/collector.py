"""A collector on a scripted source and an in-memory producer, for the collector's unit tests."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gpuhealth.gpu.readings import SourceReading
from services.collector.build import build_collector
from services.collector.metrics import CollectorMetrics
from services.collector.poller import Collector
from services.collector.settings import CollectorSection
from shared.contract.models import Source
from shared.plumbing.errors import KafkaProduceError
from shared.settings.common import TopicSettings


class FakeProducer:
    """JsonProducer's surface; refuses messages beyond `capacity` like a full local queue."""

    def __init__(self, capacity: int = 10**6) -> None:
        self.capacity = capacity
        self.messages: list[tuple[str, str | None, Any]] = []
        self.delivered = self.failed = 0

    def produce(self, topic: str, key: str | None, value: Any, **_: Any) -> None:
        if len(self.messages) >= self.capacity:
            raise KafkaProduceError("local producer queue is full", retriable=True)
        self.messages.append((topic, key, value))

    def poll(self, timeout_s: float = 0) -> int:
        return 0

    def flush(self, timeout_s: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.messages)


class FakeSource:
    kind, target = Source.MOCK, "http://n7:9400/metrics"

    def __init__(self, readings: list[SourceReading | Exception]) -> None:
        self.readings = readings

    def read(self) -> SourceReading:
        item = self.readings.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None: ...


def make_collector(
    source: FakeSource, producer: FakeProducer, **kwargs: Any
) -> tuple[Collector, CollectorMetrics]:
    metrics = CollectorMetrics(CollectorRegistry())
    collector = build_collector(
        CollectorSection(collector_id="c-1", cluster="prod", datacenter="dc1", interval_s=10),
        TopicSettings(),
        producer=producer,
        metrics=metrics,
        sources=[source],
        local_hostname="here",
        **kwargs,
    )
    return collector, metrics


def value(metrics: CollectorMetrics, name: str, **labels: str) -> float:
    """A counter's current value, for the given labels."""
    for metric in getattr(metrics, name).collect():
        for s in metric.samples:
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0

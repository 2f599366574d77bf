"""The poll loop: read every source, publish samples and events, on a monotonic schedule.

Ticks are `start + k * interval` on the monotonic clock, so the schedule does
not drift however long a poll takes; a poll that overruns skips the ticks it
missed (counted) instead of bunching up behind them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from gpuhealth.gpu.readings import GpuSource, SourceError
from shared.contract.models import GpuEvent, GpuSample
from shared.settings.common import TopicSettings

from .enrich import Enricher, reading_time
from .events import EventDetector
from .kernel_log import XidFeed
from .metrics import CollectorMetrics
from .publisher import Publisher

log = logging.getLogger(__name__)
METRICS_RAW = TopicSettings.entry("metrics_raw")  # its messages' key and value
EVENTS = TopicSettings.entry("events")  # its messages' key and value


class Collector:
    def __init__(
        self,
        *,
        sources: Sequence[GpuSource],
        enricher: Enricher,
        detector: EventDetector,
        publisher: Publisher,
        topics: TopicSettings,
        metrics: CollectorMetrics,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        xid_feeds: Sequence[XidFeed] = (),
        on_samples: Callable[[list[GpuSample]], None] | None = None,
        shutdown_flush_s: float = 5.0,
    ) -> None:
        self.sources, self.enricher, self.detector = sources, enricher, detector
        self.xid_feeds = xid_feeds  # XIDs from the kernel log, beside the sources
        self.on_samples = on_samples  # e.g. the OTLP GPU instruments
        self.publisher, self.topics, self.metrics = publisher, topics, metrics
        self.interval_s, self._monotonic = interval_s, monotonic
        self.shutdown_flush_s = shutdown_flush_s
        self._closed = False

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Publish the folded XIDs still open, give the broker `shutdown_flush_s` for what is queued
        (the rest is spooled), then close the sources and feeds. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._publish(self.detector.flush_all())  # a flood's count is never lost at shutdown
            self.publisher.close(self.shutdown_flush_s)
        finally:
            for source in self.sources:
                source.close()
            for feed in self.xid_feeds:
                feed.close()

    def poll_once(self) -> tuple[int, int]:
        """Read all sources once; returns (samples, events) queued."""
        samples_queued = events_queued = 0
        # The kernel log first: its lines carry the XIDs' own times (events.EventDetector.observe).
        for feed in self.xid_feeds:
            try:
                self.detector.take_kernel_xids(feed.name, feed.drain())
            except SourceError as e:
                self.metrics.source_errors.labels(feed.name).inc()
                log.warning("kernel log read failed: %s", e, extra={"target": feed.name})
        for source in self.sources:
            try:
                with self.metrics.scrape_seconds.labels(source.target).time():
                    reading = source.read()
            except SourceError as e:
                self.metrics.source_errors.labels(source.target).inc()
                log.warning("source read failed: %s", e, extra={"target": source.target})
                continue
            samples = [s for s in (self.enricher.sample(g, reading) for g in reading.gpus) if s]
            self.metrics.gpus.labels(source.target).set(len(samples))
            if self.on_samples is not None:
                self.on_samples(samples)
            for sample in samples:
                if self.publisher.publish(self.topics.metrics_raw, *METRICS_RAW.encode(sample)):
                    samples_queued += 1
                    self.metrics.samples.inc()
            listed = {g.uuid: g.xids for g in reading.gpus if g.xids is not None}
            at = reading_time(reading)
            events_queued += self._publish(
                self.detector.observe(source.target, reading.source, samples, at, xids=listed)
            )
        events_queued += self._publish(self.detector.kernel_xids("", [], datetime.now(UTC)))  # what is left
        events_queued += self._publish(self.detector.flush(datetime.now(UTC)))  # floods whose window ended
        self.publisher.serve()
        return samples_queued, events_queued

    def _publish(self, events: list[GpuEvent]) -> int:
        queued = 0
        for event in events:
            if self.publisher.publish(self.topics.events, *EVENTS.encode(event)):
                queued += 1
                self.metrics.events.labels(event.kind.value).inc()
                log.info("event %s", event.kind.value, extra={"gpu_uuid": event.gpu_uuid, **event.details})
        return queued

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set, then flush what is queued."""
        next_tick = self._monotonic()
        while not stop.is_set():
            self.poll_once()
            next_tick += self.interval_s
            now = self._monotonic()
            if now > next_tick:
                missed = math.ceil((now - next_tick) / self.interval_s)
                self.metrics.overruns.inc(missed)
                next_tick += missed * self.interval_s
            # Serve delivery callbacks while waiting, so the broker's acks are counted promptly.
            while not stop.is_set() and (wait := next_tick - self._monotonic()) > 0:
                stop.wait(min(wait, 0.5))
                self.publisher.serve()

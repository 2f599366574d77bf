"""The collector's own Prometheus metrics (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_collector_"
        self.scrape_seconds = Histogram(
            p + "scrape_seconds",
            "Time to read one source",
            ["target"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.samples = Counter(p + "samples_published", "Samples queued for Kafka", registry=registry)
        self.events = Counter(p + "events_published", "Events queued for Kafka", ["kind"], registry=registry)
        self.delivered = Counter(p + "delivered", "Messages the broker acknowledged", registry=registry)
        self.delivery_failures = Counter(
            p + "delivery_failures",
            "Messages the broker refused or that timed out",
            registry=registry,
        )
        self.dropped = Counter(
            p + "dropped", "Messages dropped because the queue was full", registry=registry
        )
        self.queue_depth = Gauge(p + "queue_depth", "Messages waiting for the broker", registry=registry)
        self.source_errors = Counter(
            p + "source_errors", "Failed source reads", ["target"], registry=registry
        )
        self.invalid = Counter(
            p + "invalid_values",
            "Readings dropped as invalid, by field",
            ["field"],
            registry=registry,
        )
        self.overruns = Counter(p + "poll_overruns", "Polls skipped because one ran late", registry=registry)
        self.gpus = Gauge(p + "gpus", "GPUs in the last successful read", ["target"], registry=registry)
        self.spooled = Counter(
            p + "spooled", "Messages written to the spool at shutdown (broker away)", registry=registry
        )
        self.spool_lost = Counter(
            p + "spool_lost", "Messages lost at shutdown because the spool was full", registry=registry
        )
        self.spool_resent = Counter(
            p + "spool_resent", "Spooled messages the broker acknowledged after a start", registry=registry
        )
        self._seen_delivered = 0
        self._seen_failed = 0

    def sync_delivery(self, delivered: int, failed: int) -> None:
        self.delivered.inc(delivered - self._seen_delivered)
        self.delivery_failures.inc(failed - self._seen_failed)
        self._seen_delivered, self._seen_failed = delivered, failed

"""The sink's own Prometheus metrics (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class SinkMetrics:
    """The batches' and the partitions' series, then the upkeep's (retention, archive, rollup)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_sink_"
        self.rows = Counter(
            p + "rows_written", "Rows inserted (duplicates excluded)", ["table"], registry=registry
        )
        self.duplicates = Counter(
            p + "duplicates_skipped", "Rows already stored", ["table"], registry=registry
        )
        self.consumed = Counter(p + "messages_consumed", "Messages read from Kafka", registry=registry)
        self.batches = Counter(p + "batches", "Batches committed", registry=registry)
        self.batch_seconds = Histogram(
            p + "batch_seconds",
            "Decode + write + commit time of one batch",
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.dead_letters = Counter(
            p + "dead_letters", "Records sent to the DLQ", ["category"], registry=registry
        )
        self.db_retries = Counter(p + "db_retries", "Batch writes retried after a failure", registry=registry)
        self.abandoned = Counter(
            p + "batches_abandoned",
            "Batches dropped because their partitions moved",
            registry=registry,
        )
        self.assigned = Gauge(p + "assigned_partitions", "Partitions this sink owns", registry=registry)
        self.lag = Gauge(
            p + "lag",
            "Messages behind the end of each partition",
            ["topic", "partition"],
            registry=registry,
        )
        self.chunks_dropped = Counter(
            p + "chunks_dropped", "Chunks dropped by retention", ["table"], registry=registry
        )
        self._upkeep(p, registry)

    def _upkeep(self, p: str, registry: CollectorRegistry) -> None:
        """Retention, the Parquet archive and the rollup (retention.py, archive.py)."""
        self.retention_last_success = Gauge(
            p + "retention_last_success_timestamp_seconds",
            "When a retention round last completed",
            registry=registry,
        )
        self.retention_failures = Counter(
            p + "retention_failures",
            "Retention rounds that failed (nothing dropped unarchived)",
            registry=registry,
        )
        self.archived_rows = Counter(
            p + "archived_rows", "Rows written to the Parquet archive", ["table"], registry=registry
        )
        self.archived_bytes = Counter(
            p + "archived_bytes", "Bytes of Parquet written to the archive", ["table"], registry=registry
        )
        self.archived_files = Counter(
            p + "archived_files", "Parquet files written to the archive", ["table"], registry=registry
        )
        self.archive_last_success = Gauge(
            p + "archive_last_success_timestamp_seconds",
            "When a chunk was last archived and dropped",
            ["table"],
            registry=registry,
        )
        self.rollup_last_refresh = Gauge(
            p + "rollup_last_refresh_timestamp_seconds",
            "When the 1-minute rollup was last refreshed (or its refresh job last succeeded)",
            registry=registry,
        )
        self.rollup_lag = Gauge(
            p + "rollup_lag_seconds",
            "How long the oldest stored batch has waited for the 1-minute rollup's refresh (0: current)",
            registry=registry,
        )
        self.rollup_seconds = Histogram(
            p + "rollup_refresh_seconds",
            "Time of one refresh of the 1-minute rollup",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.rollup_minutes = Counter(
            p + "rollup_minutes_refreshed", "Minutes of the 1-minute rollup recomputed", registry=registry
        )
        self.rollup_failures = Counter(
            p + "rollup_refresh_failures", "Refreshes of the 1-minute rollup that failed", registry=registry
        )

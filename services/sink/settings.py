"""The sink's settings (GPUHEALTH_SINK__*), read by its main, its one-shot commands and its builder."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.settings.common import Section, Settings


class SinkSection(Section):
    """GPUHEALTH_SINK__*: batches, lanes, retention, the rollup's refresh and the Parquet archive."""

    group_id: str = Field(default="gpu-health-sink", min_length=1, max_length=200)
    """Consumer group, also the key of its rows in `kafka_offsets`: sinks of one group split the
    partitions."""
    batch_size: int = Field(default=20_000, ge=1, le=100_000)
    """Messages per transaction at most."""
    poll_timeout_s: float = Field(default=0.5, gt=0, le=30)
    """A batch is whatever arrived within this, up to `batch_size`."""
    lanes: int = Field(default=2, ge=1, le=16)
    """Partition lanes written side by side; the sink holds two connections per lane, plus one."""
    max_message_bytes: int = Field(default=1_000_000, ge=1024, le=100_000_000)
    """Larger messages are dead-lettered."""
    statement_timeout_ms: int = Field(default=60_000, ge=1000, le=240_000)
    """A batch write slower than this fails and is retried: keeps the consumer inside
    `max.poll.interval.ms` (5 minutes) however slow the database gets."""
    max_backoff_s: float = Field(default=30.0, ge=1, le=120)
    """The longest wait between retries while the database is away."""
    keep_raw_days: int = Field(default=30, ge=1)
    """Retention of `gpu_metrics` (the sink drops older chunks, archiving them first when `archive_dir`
    is set)."""
    keep_events_days: int = Field(default=180, ge=1)
    """Retention of `gpu_events`."""
    keep_rollup_days: int = Field(default=365, ge=1)
    """Retention of the 1-minute rollup `gpu_metrics_1min`."""
    retention_interval_s: float = Field(default=600, ge=10)
    """How often a retention (and archive) round runs."""
    rollup_refresh_s: float = Field(default=0.5, gt=0, le=60)
    """While the sink is behind, the 1-minute rollup is refreshed at most this often (the minutes every
    partition has passed)."""
    rollup_caught_up_s: float = Field(default=0.25, gt=0, le=60)
    """Once the sink has caught up, the rollup is refreshed at most this often (what no other sink is
    still filling)."""
    archive_dir: Path | None = None
    """Chunks past retention are written here as Parquet before they are dropped; unset: they are
    dropped without a copy."""
    archive_block_kib: int = Field(default=16 << 10, ge=1024, le=1 << 20)
    """How much of a chunk (as COPY's CSV) is parsed and written at a time: one row group each."""
    archive_zstd_level: int = Field(default=9, ge=1, le=22)
    """The archive's zstd level."""
    session_timeout_ms: int = Field(default=45_000, ge=6000, le=300_000)
    """How long a dead sink holds its partitions before the group hands them on."""
    metrics_port: int = Field(default=9501, ge=0, le=65535)
    """Port of the sink's own `/metrics`."""
    metrics_bind: str = "127.0.0.1"
    """Address of the sink's own `/metrics`."""


class SinkSettings(Settings):
    sink: SinkSection = Field(default_factory=SinkSection)

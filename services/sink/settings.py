"""The sink's settings (GPUHEALTH_SINK__*), read by its main, its one-shot commands and its builder."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from shared.config import Settings


class SinkSection(BaseModel):
    """GPUHEALTH_SINK__*"""

    group_id: str = Field(default="gpu-health-sink", min_length=1, max_length=200)
    batch_size: int = Field(default=20_000, ge=1, le=100_000)
    poll_timeout_s: float = Field(default=0.5, gt=0, le=30)
    # Partition lanes written side by side, each on two connections (see SinkLoop).
    lanes: int = Field(default=2, ge=1, le=16)
    max_message_bytes: int = Field(default=1_000_000, ge=1024, le=100_000_000)
    # A batch write slower than this fails and is retried: keeps the consumer inside
    # max.poll.interval.ms (5 minutes) however slow the database gets.
    statement_timeout_ms: int = Field(default=60_000, ge=1000, le=240_000)
    max_backoff_s: float = Field(default=30.0, ge=1, le=120)
    keep_raw_days: int = Field(default=30, ge=1)
    keep_events_days: int = Field(default=180, ge=1)
    keep_rollup_days: int = Field(default=365, ge=1)
    retention_interval_s: float = Field(default=600, ge=10)
    # The 1-minute rollup is refreshed after batches were stored (rollup.py): at most this often
    # while the sink is behind, and at most every ROLLUP_CAUGHT_UP_S once it has caught up.
    rollup_refresh_s: float = Field(default=0.5, gt=0, le=60)
    rollup_caught_up_s: float = Field(default=0.25, gt=0, le=60)
    # Chunks past retention are written here as Parquet before they are dropped (archive.py);
    # unset: they are dropped without a copy.
    archive_dir: Path | None = None
    archive_block_kib: int = Field(default=16 << 10, ge=1024, le=1 << 20)  # CSV read per Arrow batch
    archive_zstd_level: int = Field(default=9, ge=1, le=22)
    # How long a dead sink holds its partitions before the group hands them on.
    session_timeout_ms: int = Field(default=45_000, ge=6000, le=300_000)
    metrics_port: int = Field(default=9501, ge=0, le=65535)
    metrics_bind: str = "127.0.0.1"


class SinkSettings(Settings):
    sink: SinkSection = Field(default_factory=SinkSection)

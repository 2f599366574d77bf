"""The sink's workload loop: gpu-processes and llm-sessions into TimescaleDB, beside the metrics loop.

It is the records loop (records.py) with the workload family
(workload_rows.py), in its own consumer group (`<sink group>-workload`) and its
own thread, so neither lane waits on the other: per batch one transaction of
rows, dead letters and offsets; refused records split out and dead-lettered
exactly once; offsets resumed from the database; the lag on /metrics. Old
chunks are dropped on a timer (workload.KEEP_DAYS), under either TimescaleDB
license.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import psycopg

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.plumbing.kafka import close_consumer, make_consumer, make_producer
from shared.settings.common import DatabaseSettings, Settings
from shared.store import workload
from shared.store.workload import KEEP_DAYS

from .metrics import SinkMetrics
from .records import RecordFamilyLoop
from .workload_rows import WorkloadRecords

log = logging.getLogger(__name__)


class WorkloadRetention:
    """Drops the workload tables' old chunks, at most every `interval_s` (call it between batches)."""

    def __init__(
        self,
        settings: DatabaseSettings,
        *,
        keep_days: Mapping[str, int] = KEEP_DAYS,
        interval_s: float = 600.0,
    ) -> None:
        self.settings, self.keep_days, self.interval_s = settings, dict(keep_days), interval_s
        self._next = 0.0
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def drop_old_chunks(self, keep_days: Mapping[str, int]) -> dict[str, int]:
        """drop_chunks on each table (DatabaseError if it failed); chunks dropped per table."""
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.settings)
            return workload.drop_old_chunks(self._conn, keep_days)
        except DatabaseError as e:
            self.close()
            raise DatabaseError(f"workload retention failed: {e}") from e

    def __call__(self) -> None:
        """A round, if one is due; a failure waits for the next round."""
        if (now := time.monotonic()) < self._next:
            return
        self._next = now + self.interval_s
        try:
            dropped = self.drop_old_chunks(self.keep_days)
        except DatabaseError as e:
            log.warning("workload retention skipped this round: %s", e)
            return
        if any(dropped.values()):
            log.info("workload retention dropped chunks", extra={"dropped": dropped})

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class WorkloadLoop(RecordFamilyLoop):
    """The loop of the workload family, gpu-processes and llm-sessions. Constructor: RecordFamilyLoop's,
    its family and retention set.

    `run(stop)` consumes on the calling thread (as every sink loop); as a context manager it
    closes its consumer and its retention connection once, after run() has returned.
    """

    family_type = WorkloadRecords

    def __init__(
        self,
        *,
        keep_days: Mapping[str, int] = KEEP_DAYS,
        retention_interval_s: float = 600.0,
        batch_size: int = 5000,
        **loop: Any,
    ) -> None:
        """RecordFamilyLoop's keywords (`loop`), and how long each workload table keeps its rows."""
        self.retention = WorkloadRetention(loop["db"], keep_days=keep_days, interval_s=retention_interval_s)
        super().__init__(batch_size=batch_size, housekeeping=self.retention, **loop)

    @classmethod
    def from_settings(cls, settings: Settings, *, group_id: str, metrics: SinkMetrics) -> WorkloadLoop:
        """The loop of the sink whose group is `group_id` (its own group: `<group_id>-workload`)."""
        group = f"{group_id}-workload"
        return cls(
            consumer=make_consumer(settings.kafka, group_id=group),
            dlq_producer=make_producer(settings.kafka),
            db=settings.db,
            topics=settings.topics,
            group=group,
            metrics=metrics,
            dlq_reader=lambda: make_consumer(settings.kafka, group_id=f"{group}-dlq-check"),
        )

    def __enter__(self) -> WorkloadLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close its consumer and its retention (after run() has returned); a second call does nothing."""
        close_consumer(self.consumer)
        self.retention.close()

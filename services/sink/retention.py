"""Retention: drop chunks past their table's retention, archiving them to Parquet first when configured.

Under the apache license this loop is the retention; under the timescale
license retention policies drop chunks, unless an archive directory is set:
then the policies are removed and this loop archives and drops instead (a
policy would drop chunks nobody had archived). Runs at most every
`interval_s`, in a thread of its own so a long archive never stalls the
consumer, from whichever sink process takes a session-level advisory lock
keyed by the schema, so several sinks do not race each other while tenants in
other schemas are not held up. See services/sink/archive.py for how a chunk
is archived without loss or duplicates even when the process is killed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.settings.common import DatabaseSettings
from shared.store import retention as store
from shared.store.archive import Chunk, Conn, expired_chunks
from shared.store.server import timescale_info

from .archive import ArchiveError, ArchiveInterruptedError, ParquetArchive
from .metrics import SinkMetrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Retention:
    settings: DatabaseSettings
    metrics: SinkMetrics
    keep_raw_days: int = 30
    keep_events_days: int = 180
    keep_rollup_days: int = 365
    interval_s: float = 600.0
    archive_dir: Path | None = None
    archive_block_kib: int = 16 << 10
    archive_zstd_level: int = 9
    _next_run: float = 0.0
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __call__(self) -> None:
        """Start a round in the background when one is due and none is running."""
        now = time.monotonic()
        if now < self._next_run or (self._thread is not None and self._thread.is_alive()):
            return
        self._next_run = now + self.interval_s
        self._thread = threading.Thread(target=self.run_round, name="retention", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop between chunks (the chunk in hand stays for the next run) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run_round(self) -> None:
        """One round, with failures logged and counted rather than raised."""
        try:
            self.run_once()
        except ArchiveInterruptedError as e:
            log.info("%s", e)
        except (DatabaseError, ArchiveError, OSError) as e:
            self.metrics.retention_failures.inc()
            log.warning("retention skipped this round: %s", e)

    def run_once(self) -> dict[str, int]:
        """Archive (if configured) and drop the chunks past retention; returns chunks dropped per table."""
        dropped: dict[str, int] = {}
        archive = None
        if self.archive_dir is not None:
            archive = ParquetArchive(
                self.archive_dir, batch_bytes=self.archive_block_kib << 10, zstd_level=self.archive_zstd_level
            )
        with connect(self.settings, autocommit=True) as conn:
            # delivered dead letters are kept as long as events, then forgotten
            deleted = store.forget_delivered_dead_letters(conn, self.keep_events_days)
            if deleted:
                log.info("forgot %d delivered dead letters", deleted)
            full = timescale_info(conn).full_features
            if full:
                self._rollup_refresh_from_jobs(conn)
                if archive is None:
                    return dropped  # retention policies do it
            if not store.try_retention_lock(conn):
                return dropped
            try:
                if archive is not None:
                    archive.remove_leftovers()
                for table, days in (
                    ("gpu_metrics", self.keep_raw_days),
                    ("gpu_events", self.keep_events_days),
                    ("gpu_metrics_1min", self.keep_rollup_days),
                ):
                    if full:
                        store.remove_retention_policy(conn, table)
                    cutoff = datetime.now(UTC) - timedelta(days=days)
                    if archive is None:
                        dropped[table] = store.drop_chunks_older_than(conn, table, cutoff)
                    else:
                        dropped[table] = self._archive_and_drop(conn, archive, table, cutoff)
                    self.metrics.chunks_dropped.labels(table).inc(dropped[table])
            finally:
                store.release_retention_lock(conn)
        self.metrics.retention_last_success.set_to_current_time()
        if any(dropped.values()):
            log.info("retention dropped chunks", extra={"dropped": dropped})
        return dropped

    def _archive_and_drop(self, conn: Conn, archive: ParquetArchive, table: str, cutoff: datetime) -> int:
        done = 0
        for chunk in expired_chunks(conn, table, cutoff):
            if self._stop.is_set():
                raise ArchiveInterruptedError("stopping: the remaining chunks are left for the next run")
            # Late rows for this time range wait for the commit instead of slipping in
            # between the copy and the drop.
            with store.share_locked(conn, chunk):
                archived = archive.write_chunk(conn, chunk, self._stop)
                self._drop_exactly(conn, chunk)
            done += 1
            self.metrics.archived_rows.labels(table).inc(archived.rows)
            self.metrics.archived_bytes.labels(table).inc(archived.bytes)
            self.metrics.archived_files.labels(table).inc(len(archived.files))
            self.metrics.archive_last_success.labels(table).set_to_current_time()
            log.info(
                "archived and dropped %s",
                chunk.name,
                extra={
                    "table": table,
                    "rows": archived.rows,
                    "bytes": archived.bytes,
                    "files": [str(f.path) for f in archived.files],
                },
            )
        return done

    @staticmethod
    def _drop_exactly(conn: Conn, chunk: Chunk) -> None:
        """Drop this chunk and nothing else (another chunk would not have been archived)."""
        relation = chunk.relation(conn)
        if not store.range_holds_only(conn, chunk):
            raise ArchiveError(f"dropping {relation} by its range would drop other chunks; left alone")
        dropped = store.drop_chunk_range(conn, chunk)
        if dropped != 1:
            raise ArchiveError(f"dropping {relation} dropped {dropped} chunks; rolled back")

    def _rollup_refresh_from_jobs(self, conn: Conn) -> None:
        """Under the timescale license the rollup is refreshed by a job: mirror its last success."""
        finished = store.last_rollup_refresh(conn)
        if finished is not None:
            self.metrics.rollup_last_refresh.set(finished.timestamp())

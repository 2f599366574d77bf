"""Retention under the apache license: drop_chunks on a timer (the timescale license uses policies).

Runs at most every `interval_s`, from whichever sink process first takes a
transaction-level advisory lock, so several sinks do not race each other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from shared.config import DatabaseSettings
from shared.db import connect, timescale_info
from shared.errors import DatabaseError

from .metrics import SinkMetrics

log = logging.getLogger(__name__)

_LOCK_ID = 0x6770_7573_696E_6B31  # arbitrary, fixed: "retention" for every sink


@dataclass(slots=True)
class Retention:
    settings: DatabaseSettings
    metrics: SinkMetrics
    keep_raw_days: int = 30
    keep_events_days: int = 180
    keep_rollup_days: int = 365
    interval_s: float = 600.0
    _next_run: float = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next_run:
            return
        self._next_run = now + self.interval_s
        try:
            self.run_once()
        except DatabaseError as e:
            log.warning("retention skipped this round: %s", e)

    def run_once(self) -> dict[str, int]:
        """Drop chunks older than the retention of each table; returns chunks dropped per table."""
        dropped: dict[str, int] = {}
        try:
            with connect(self.settings) as conn:
                # delivered dead letters are kept as long as events, then forgotten
                deleted = conn.execute(
                    "DELETE FROM sink_dead_letters WHERE delivered_at < now() - make_interval(days => %s)",
                    (self.keep_events_days,),
                ).rowcount
                conn.commit()
                if deleted:
                    log.info("forgot %d delivered dead letters", deleted)
                if timescale_info(conn).full_features:
                    return dropped  # retention policies do it
                if not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (_LOCK_ID,)).fetchone()[0]:  # type: ignore[index]
                    return dropped
                for table, days in (
                    ("gpu_metrics", self.keep_raw_days),
                    ("gpu_events", self.keep_events_days),
                    ("gpu_metrics_1min", self.keep_rollup_days),
                ):
                    rows = conn.execute(
                        "SELECT drop_chunks(%s::regclass, older_than => now() - make_interval(days => %s))",
                        (table, days),
                    ).fetchall()
                    dropped[table] = len(rows)
                    self.metrics.chunks_dropped.labels(table).inc(len(rows))
                conn.commit()
        except psycopg.Error as e:
            raise DatabaseError(f"retention failed: {e}") from e
        if any(dropped.values()):
            log.info("retention dropped chunks", extra={"dropped": dropped})
        return dropped

"""The 1-minute rollup's refresh loop: recomputes the minutes that stored batches noted, after them.

A batch notes the minutes it stored samples in, in its own transaction
(writer.py); this thread, on its own connection, refreshes them
(shared.store.rollup: schema/0014's gpu_metrics_1min_refresh() takes the
committed notes and recomputes those minutes from gpu_metrics). A minute is recomputed whole, so
refreshing while it still fills costs its rows again. While the sink is behind
it refreshes at most every `interval_s` (the first time `interval_s` after it
fell behind), and (given `complete_for`, its group and samples' topic) only
the minutes every partition still being filled has passed (their frontier,
schema/0018): lanes fill the same minutes at different moments, and a minute
is then recomputed once rather than after each lane. Once it has caught up (a
wait for messages brought none, nothing is left to fetch, every batch is
stored) it marks its partitions caught up (0019; its next batch clears the
mark) and refreshes, at most every `caught_up_s`, what no other sink's
partition is still filling: everything, once every sink has caught up. The lag
(how long the oldest stored but unrefreshed batch has waited) is on /metrics:
once every sink has caught up it is bounded by the interval plus one refresh
while the database is up; while one is behind, minutes wait for its slowest
partition. Readers keep to the refreshed minutes through
gpu_metrics_1min_settled(). A last refresh of everything runs on close, so a
sink that stops cleanly leaves the rollup whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from datetime import timedelta

import psycopg

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.settings.common import DatabaseSettings
from shared.store import offsets, rollup, samples
from shared.store.offsets import Partition

from .metrics import SinkMetrics

log = logging.getLogger(__name__)


class RollupRefresher:
    def __init__(
        self,
        settings: DatabaseSettings,
        metrics: SinkMetrics,
        *,
        interval_s: float = 0.5,
        caught_up_s: float = 0.25,
        keep_raw: timedelta = timedelta(days=30),
        statement_timeout_ms: int = 60_000,
        complete_for: tuple[str, str] | None = None,
    ) -> None:
        """`complete_for`: (consumer group, samples topic) whose partitions' frontiers bound a
        refresh while the sink is behind; None refreshes every noted minute always."""
        self.settings, self.metrics = settings, metrics
        self.complete_for = complete_for
        self._behind = False  # the last batch stored was not caught up with the stream
        self._own: frozenset[Partition] = frozenset()  # while caught up: the partitions it has done
        self._marked = True  # _own is marked caught up in kafka_offsets (no batch stored since)
        self._hold_until = 0.0  # having fallen behind, no refresh before then (monotonic)
        self._held_at = -float("inf")  # when that hold was last set: at most one every two intervals
        self._events = 0  # stored() and caught_up() calls: what a refresh saw may have changed since
        self.interval_s, self.caught_up_s, self.keep_raw = interval_s, caught_up_s, keep_raw
        self._pause_s = interval_s  # the pause that applies now
        self.statement_timeout_ms = statement_timeout_ms
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiting_since: float | None = None  # the oldest stored batch not yet refreshed
        self._stored = 0  # batches stored so far (a refresh covers those stored before it began)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._thread: threading.Thread | None = None
        metrics.rollup_lag.set_function(self.lag_s)

    def lag_s(self) -> float:
        """Seconds the oldest stored but unrefreshed batch has waited (0: the rollup is current)."""
        since = self._waiting_since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def stored(self, *, caught_up: bool = True) -> None:
        """A batch with samples was committed: its minutes are to be refreshed.

        `caught_up`: the sink has caught up with the stream: refresh soon. The batch cleared
        its partitions' caught-up marks; `caught_up()` sets them again once all is stored.
        """
        with self._lock:
            now = time.monotonic()
            self._pause_s = min(self.caught_up_s, self.interval_s) if caught_up else self.interval_s
            if caught_up:
                self._hold_until = 0.0
            elif not self._behind and now - self._held_at >= 2 * self.interval_s:
                # fallen behind: the other lanes store meanwhile (not re-armed by every flip)
                self._hold_until = self._held_at = now + self.interval_s
            self._behind = not caught_up
            self._own, self._marked = frozenset(), True
            self._events += 1
            self._stored += 1
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
        self._wake.set()

    def caught_up(self, own: Collection[Partition] = ()) -> None:
        """The sink found no more messages (`own`: its samples' partitions): refresh soon.

        Also with nothing of its own to refresh: its partitions are marked caught up by the
        refresh, so that they hold back no other sink's.
        """
        done = frozenset(own)
        with self._lock:
            if not self._behind and self._own == done and self._marked:
                return
            if self._own != done:
                self._marked = not done
            self._behind, self._own, self._hold_until = False, done, 0.0
            self._events += 1
            # marking its partitions may let another sink's refresh through: at once
            self._pause_s = 0.0 if not self._marked else min(self.caught_up_s, self.interval_s)
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rollup-refresh", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the thread, then refresh once more (what the last batches noted)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._waiting_since is not None:
            self.refresh(whole=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            while (pause := max(last + self._pause_s, self._hold_until) - time.monotonic()) > 0:
                if self._stop.wait(min(pause, 0.05)):  # so a catch-up is seen soon
                    return
            self._wake.clear()
            last = time.monotonic()
            if not self.refresh():
                self._stop.wait(min(5.0, 4 * self.interval_s))  # the database is away: not in a spin
                self._wake.set()

    def refresh(self, *, whole: bool = False) -> bool:
        """One refresh of the minutes every partition has passed (`whole`: of every noted minute);
        False (logged and counted) if it failed.

        While caught up, the sink's own partitions are first marked so (they no longer hold
        back its, or another sink's, refreshes) and are left out of the frontier.
        """
        with self._lock:
            seen = self._stored
            started = time.monotonic()
            complete_for = None if whole else self.complete_for
            own = self._own if not self._behind else frozenset()
            mark, events = not self._marked, self._events
        try:
            conn = self._connection()
            if mark and own and self.complete_for is not None:
                offsets.mark_caught_up(conn, self.complete_for[0], own)
            if mark:
                with self._lock:  # unless a batch (which clears the marks) came in meanwhile
                    self._marked = self._marked or self._events == events
            minutes = rollup.refresh(conn, self.keep_raw, complete_for, caught_up=own)
            # minutes left noted (not yet passed by every partition) wait on: since when
            left = rollup.oldest_note_age(conn) if complete_for is not None else None
        except DatabaseError as e:
            self.metrics.rollup_failures.inc()
            log.warning("rollup refresh failed, retrying: %s", e)
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return False
        with self._lock:
            if left is not None:  # held back for partitions not done yet: look again in a while
                self._waiting_since = time.monotonic() - left
                if self._events == events:  # else a newer call set the pause
                    self._pause_s = self.interval_s
                self._wake.set()
            else:  # batches stored after the refresh began may not be in it: they keep waiting
                self._waiting_since = None if self._stored == seen else started
        self.metrics.rollup_seconds.observe(time.monotonic() - started)
        self.metrics.rollup_minutes.inc(minutes)
        self.metrics.rollup_last_refresh.set_to_current_time()
        return True

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.settings)
            samples.set_statement_timeout(self._conn, self.statement_timeout_ms)
        return self._conn

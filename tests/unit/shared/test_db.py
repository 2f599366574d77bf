"""Statements cancelled at stop: only after the grace, again until the block ends, never before stop."""

from __future__ import annotations

import threading
import time

import psycopg

from shared.db import statements_cancelled_on


class Connection:
    """What the watcher uses of a psycopg connection: whether it is closed, and cancel_safe()."""

    def __init__(self, *, closed: bool = False, fails: bool = False) -> None:
        self.closed, self.fails = closed, fails
        self.cancelled: list[float] = []

    def cancel_safe(self, timeout: float) -> None:
        self.cancelled.append(time.monotonic())
        if self.fails:
            raise psycopg.OperationalError("server gone")


def test_a_block_that_ends_within_the_grace_cancels_nothing() -> None:
    stop, conn = threading.Event(), Connection()
    with statements_cancelled_on(stop, lambda: [conn], grace_s=0.5, every_s=0.05):  # type: ignore[list-item]
        stop.set()
        time.sleep(0.1)
    time.sleep(0.6)
    assert conn.cancelled == []


def test_without_stop_nothing_is_cancelled() -> None:
    conn = Connection()
    with statements_cancelled_on(threading.Event(), lambda: [conn], grace_s=0.0, every_s=0.05):  # type: ignore[list-item]
        time.sleep(0.4)
    assert conn.cancelled == []


def test_past_the_grace_every_open_connection_is_cancelled_until_the_block_ends() -> None:
    stop = threading.Event()
    hung, closed, gone = Connection(), Connection(closed=True), Connection(fails=True)
    with statements_cancelled_on(stop, lambda: [hung, closed, gone], grace_s=0.1, every_s=0.05):  # type: ignore[list-item]
        stop.set()
        started = time.monotonic()
        time.sleep(0.5)
    ended = time.monotonic()
    assert len(hung.cancelled) >= 2, "cancelled, and again while the block lasts"
    assert min(hung.cancelled) - started >= 0.1, "not before the grace"
    assert closed.cancelled == []
    assert len(gone.cancelled) == len(hung.cancelled), "a failing cancel does not stop the others"
    time.sleep(0.2)
    assert max(hung.cancelled) <= ended, "nothing is cancelled after the block"

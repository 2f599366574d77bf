"""A stopping service's statements: cancelled only after the grace, cut after the cut point, never before
stop; no new connection past the cut point."""

from __future__ import annotations

import socket
import threading
import time

import psycopg
import pytest
from psycopg import pq

from shared.plumbing.db import StopPhases, connect, statements_cancelled_on
from shared.plumbing.errors import DatabaseUnavailableError
from shared.settings.common import DatabaseSettings


class PgConn:
    def __init__(self, status: pq.TransactionStatus, sock: int) -> None:
        self.transaction_status, self.socket = status, sock


class Connection:
    """What the watcher uses of a psycopg connection: closed, whether busy, cancel_safe() and its socket."""

    def __init__(
        self, *, closed: bool = False, fails: bool = False, busy: bool = True, deaf: bool = False
    ) -> None:
        self.closed, self.fails, self.deaf = closed, fails, deaf
        self.ours, self.server = socket.socketpair()  # the connection's end, and the server's
        status = pq.TransactionStatus.ACTIVE if busy else pq.TransactionStatus.IDLE
        self.pgconn = PgConn(status, self.ours.fileno())
        self.cancelled: list[float] = []

    def cancel_safe(self, timeout: float) -> None:
        self.cancelled.append(time.monotonic())
        if self.deaf:  # the cancel request gets no answer: it waits out its timeout
            time.sleep(timeout)
            raise psycopg.errors.ConnectionTimeout("cancellation timeout expired")
        if self.fails:
            raise psycopg.OperationalError("server gone")

    def was_cut(self) -> bool:
        """Whether its socket was shut down: the server's end then reads the end of the stream."""
        self.server.settimeout(0.5)
        try:
            return self.server.recv(1) == b""
        except TimeoutError:
            return False


def test_a_block_that_ends_within_the_grace_cancels_nothing() -> None:
    stop, conn = threading.Event(), Connection()
    with statements_cancelled_on(stop, lambda: [conn], phases=StopPhases(0.5, 1.0), every_s=0.05):  # type: ignore[list-item]
        stop.set()
        time.sleep(0.1)
    time.sleep(0.6)
    assert conn.cancelled == []


def test_without_stop_nothing_is_cancelled() -> None:
    conn = Connection()
    with statements_cancelled_on(threading.Event(), lambda: [conn], phases=StopPhases(0, 0), every_s=0.05):  # type: ignore[list-item]
        time.sleep(0.4)
    assert conn.cancelled == []
    assert not conn.was_cut()


def test_past_the_grace_every_busy_connection_is_cancelled_until_the_block_ends() -> None:
    stop = threading.Event()
    hung, closed, gone = Connection(), Connection(closed=True), Connection(fails=True)
    idle = Connection(busy=False)
    conns = [hung, closed, gone, idle]
    with statements_cancelled_on(stop, lambda: conns, phases=StopPhases(0.1, 5.0), every_s=0.05):  # type: ignore[arg-type,return-value]
        stop.set()
        started = time.monotonic()
        time.sleep(0.5)
    ended = time.monotonic()
    assert len(hung.cancelled) >= 2, "cancelled, and again while the block lasts"
    assert min(hung.cancelled) - started >= 0.1, "not before the grace"
    assert closed.cancelled == []
    assert idle.cancelled == []
    assert len(gone.cancelled) == len(hung.cancelled), "a failing cancel does not stop the others"
    time.sleep(0.2)
    assert max(hung.cancelled) <= ended, "nothing is cancelled after the block"
    assert not any(c.was_cut() for c in conns), "nothing is cut before the cut point"


def test_past_the_cut_point_a_busy_connection_is_cut_and_an_idle_one_is_not() -> None:
    """A server that does not answer gets no cancel either: the connection's socket is shut down, so the
    statement waiting on it fails at once."""
    stop = threading.Event()
    deaf, idle = Connection(fails=True), Connection(busy=False)
    with statements_cancelled_on(stop, lambda: [deaf, idle], phases=StopPhases(0.05, 0.2), every_s=0.05):  # type: ignore[list-item]
        stop.set()
        started = time.monotonic()
        while not deaf.was_cut():
            assert time.monotonic() - started < 3, "the busy connection was never cut"
        cut_after = time.monotonic() - started
    assert cut_after >= 0.2 - 0.01
    assert not idle.was_cut()


def test_cancels_a_deaf_server_never_answers_do_not_put_off_the_cut() -> None:
    """Ten statements waiting on a server that does not answer: each cancel waits out its timeout, yet
    every connection is cut soon after the cut point, not ten timeouts later."""
    stop = threading.Event()
    deaf = [Connection(deaf=True) for _ in range(10)]
    with statements_cancelled_on(stop, lambda: deaf, phases=StopPhases(0.1, 0.6), every_s=0.5):  # type: ignore[arg-type,return-value]
        stop.set()
        started = time.monotonic()
        for conn in deaf:
            while not conn.was_cut():
                assert time.monotonic() - started < 2.0, "a connection was not cut in time"


def test_a_stopping_process_opens_no_connection_past_the_cut_point() -> None:
    """Before it, an attempt may take only the time left (here: less than a second, so none); the refusal
    ends with the block."""
    stop = threading.Event()
    nowhere = DatabaseSettings(host="127.0.0.1", port=1, connect_timeout_s=30)
    with statements_cancelled_on(stop, list, phases=StopPhases(0.0, 0.5), every_s=0.05, refuse_new=True):
        stop.set()
        time.sleep(0.3)  # the watcher has seen `stop`
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailableError, match="stopping"):
            connect(nowhere)
        assert time.monotonic() - started < 0.5
    with pytest.raises(DatabaseUnavailableError, match="cannot connect"):  # tried again, refused by the port
        connect(nowhere)

"""shared.plumbing.running: teardown in reverse on any exit, signals set stop, closing twice is safe."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from shared.plumbing.db import wait_for_database
from shared.plumbing.errors import DatabaseUnavailableError
from shared.plumbing.kafka import JsonProducer, close_consumer, closing_consumer
from shared.plumbing.running import ServiceRun, running
from shared.settings.common import DatabaseSettings, ShutdownSettings


class Resource:
    """Records when it is closed, into a log shared by all the resources of a test."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __enter__(self) -> Resource:
        self.log.append(f"open {self.name}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.log.append(f"close {self.name}")


class StopAware:
    """A loop that runs until stopped and notes whether `stop` was set when it returned."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.saw_stop = False

    def run(self, stop: threading.Event) -> None:
        self.started.set()
        stop.wait(30)
        self.saw_stop = stop.is_set()


def test_resources_close_in_reverse_order_once_the_block_ends() -> None:
    log: list[str] = []
    with ServiceRun("t") as life:
        for name in ("metrics", "producer", "consumer"):
            life.enter_context(Resource(name, log))
        log.append("run")
    assert log == [
        "open metrics", "open producer", "open consumer", "run",
        "close consumer", "close producer", "close metrics",
    ]  # fmt: skip


def test_an_exception_still_closes_everything_in_reverse_and_propagates() -> None:
    log: list[str] = []
    life = ServiceRun("t")

    def service() -> None:
        with life:
            life.enter_context(Resource("a", log))
            life.enter_context(Resource("b", log))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        service()
    assert log == ["open a", "open b", "close b", "close a"]
    assert life.stop.is_set()  # threads the service started are told to stop before the joins


def test_a_failing_close_does_not_keep_the_others_from_closing() -> None:
    log: list[str] = []

    def broken() -> None:
        raise OSError("disk gone")

    def service() -> None:
        with ServiceRun("t") as life:
            life.enter_context(Resource("first", log))
            life.callback(broken)
            life.enter_context(Resource("last", log))

    with pytest.raises(OSError, match="disk gone"):
        service()
    assert log == ["open first", "open last", "close last", "close first"]


def test_sigterm_and_sigint_set_stop_and_the_previous_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with ServiceRun("t") as life:
            assert not life.stop.is_set()
            os.kill(os.getpid(), sig)
            assert life.stop.wait(5)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_thread_started_through_the_lifecycle_is_stopped_and_joined_at_the_end() -> None:
    loop = StopAware()
    with ServiceRun("t") as life:
        thread = life.start_thread(loop, "worker")
        assert loop.started.wait(5)
    assert not thread.is_alive()
    assert loop.saw_stop


def test_running_stops_and_joins_its_loop_on_an_exception_too() -> None:
    loop = StopAware()
    stop = threading.Event()

    def failing_test() -> None:
        with running(loop, name="worker", stop=stop):
            assert loop.started.wait(5)
            raise ValueError("test failed")

    with pytest.raises(ValueError, match="test failed"):
        failing_test()
    assert stop.is_set()
    assert loop.saw_stop


class FakeConsumer:
    """Closes like confluent_kafka.Consumer: a second close raises RuntimeError."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")
        self.closed += 1


class FakeProducer:
    def __init__(self, undelivered: int = 0) -> None:
        self.flushes, self.undelivered = 0, undelivered

    def flush(self, timeout: float = 30.0) -> int:
        self.flushes += 1
        return self.undelivered


def test_closing_twice_is_safe_for_consumers_producers_and_the_stack() -> None:
    consumer: Any = FakeConsumer()
    with ServiceRun("t") as life:
        life.enter_context(closing_consumer(consumer))
        close_consumer(consumer)  # the loop closed it already: the stack's close is a no-op
    assert consumer.closed == 1
    life.close()  # the stack itself, closed again
    raw: Any = FakeProducer()
    with JsonProducer(raw) as producer:
        producer.close()
    assert raw.flushes == 2  # a second flush of an empty queue: nothing left, nothing raised


def test_undelivered_messages_are_reported_when_a_producer_closes(caplog: pytest.LogCaptureFixture) -> None:
    raw: Any = FakeProducer(undelivered=3)
    with JsonProducer(raw):
        pass
    assert "undelivered" in caplog.text


def test_signals_are_left_alone_off_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[Any] = []

    def elsewhere() -> None:
        with ServiceRun("t") as life:
            seen.append(signal.getsignal(signal.SIGTERM))
        seen.append(life.stop.is_set())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(5)
    assert seen == [before, True]


def test_a_stop_while_waiting_for_the_database_ends_the_wait() -> None:
    """SIGTERM before the database came up: the service stops instead of waiting out its two minutes."""
    nowhere = DatabaseSettings(host="127.0.0.1", port=1)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    assert wait_for_database(nowhere, timeout_s=3600, stop=stop) is None


def test_a_lifecycle_stopped_while_waiting_serves_no_metrics_and_its_block_ends() -> None:
    nowhere = DatabaseSettings(host="127.0.0.1", port=1)
    registry = CollectorRegistry()
    with ServiceRun("waiting") as life:
        threading.Timer(0.5, life.stop.set).start()
        life.serve_metrics(registry, 0, "127.0.0.1", database=nowhere)
        assert life.stop.is_set()


def test_without_a_stop_the_wait_still_gives_up_with_the_reason() -> None:
    with pytest.raises(DatabaseUnavailableError, match="not reachable in"):
        wait_for_database(DatabaseSettings(host="127.0.0.1", port=1), timeout_s=0.3)


HANGS_AFTER_SIGTERM = """
import os, signal, time
from shared.settings.common import ShutdownSettings
from shared.plumbing.running import ServiceRun
with ServiceRun("stuck", ShutdownSettings(timeout_s=2)) as life:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # a loop that never looks at `stop`
"""


def test_a_service_still_held_at_the_shutdown_deadline_logs_its_stacks_and_exits_1_there() -> None:
    """Whatever holds the block (a loop that ignores `stop`, a call that never returns), the process ends
    at the deadline, before an orchestrator's SIGKILL, saying where it was stuck."""
    import subprocess
    import sys

    from tests.paths import REPO

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", HANGS_AFTER_SIGTERM], cwd=REPO, capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "did not stop within 2 s" in done.stdout + done.stderr
    assert "in <module>" in done.stderr  # the stack of the thread it was stuck in
    assert took < 10


def test_a_thread_is_joined_for_what_is_left_of_the_deadline_not_more() -> None:
    class Deaf:
        def run(self, stop: threading.Event) -> None:
            time.sleep(5)

    started = time.monotonic()
    with ServiceRun("t", ShutdownSettings(timeout_s=2)) as life:
        life.start_thread(Deaf(), "deaf")
        life.stop.set()
        time.sleep(0.5)
        joined_from = time.monotonic()
    assert time.monotonic() - joined_from < 2.0
    assert time.monotonic() - started < 2.8

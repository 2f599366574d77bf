"""run_service, the one skeleton every service's main is: its exit statuses, what it logs, its order."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from shared.plumbing.errors import ConfigError, KafkaUnavailableError
from shared.plumbing.running import Loop, ServiceRun, run_service, stopped
from shared.settings.common import Settings

log = logging.getLogger("services.probe")


class Probe:
    """A service that records what run_service asked of it; `fail` says where it fails."""

    def __init__(self, settings: Settings, fail: str = "", status: int = 0) -> None:
        self.settings, self.fail, self.status, self.seen = settings, fail, status, ["built"]
        if fail == "build":
            raise ConfigError("the policy file is not TOML")

    def start(self, life: ServiceRun) -> Loop:
        self.seen.append("start")
        life.callback(self.seen.append, "closed")
        if self.fail == "start":
            raise OSError(98, "cannot serve /metrics on 127.0.0.1:1: Address already in use")
        if self.fail == "kafka":
            raise KafkaUnavailableError("no broker", retriable=True)
        return self

    def run(self, stop: threading.Event) -> None:
        self.seen.append(f"run, stop set: {stop.is_set()}")

    def stopped(self) -> int:
        self.seen.append("stopped")
        return stopped(log) if self.status == 0 else self.status


@pytest.fixture(autouse=True)
def no_arguments(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "argv", ["probe"])  # pytest's own arguments are not the service's
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level  # the service's JSON logging set up, taken down


def said(capsys: pytest.CaptureFixture[str], level: str) -> list[tuple[str, str]]:
    """(logger, message) of each JSON log line of `level` the service wrote."""
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    return [(line["logger"], line["msg"]) for line in lines if line["level"] == level]


def run(made: list[Probe], fail: str = "", status: int = 0, **kwargs: str) -> int:
    def build(settings: Settings) -> Probe:
        made.append(Probe(settings, fail, status))
        return made[-1]

    return run_service(Settings, "probe", build, log=log, **kwargs)


def test_a_service_runs_then_closes_then_says_it_stopped(capsys: pytest.CaptureFixture[str]) -> None:
    made: list[Probe] = []
    assert run(made) == 0
    assert made[0].seen == ["built", "start", "run, stop set: False", "closed", "stopped"]
    assert [m for who, m in said(capsys, "info") if who == "services.probe"] == ["stopped"]


def test_its_own_exit_status_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([], status=1) == 1
    assert [m for who, m in said(capsys, "info") if who == "services.probe"] == []


def test_invalid_settings_exit_2_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUHEALTH_SHUTDOWN__TIMEOUT_S", "soon")
    made: list[Probe] = []
    assert run(made) == 2
    assert made == []
    assert "GPUHEALTH_SHUTDOWN__TIMEOUT_S" in capsys.readouterr().err


def test_a_build_that_fails_exits_2_with_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    made: list[Probe] = []
    assert run(made, fail="build") == 2
    assert made == []
    assert said(capsys, "error") == [("services.probe", "the policy file is not TOML")]


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        (
            "start",
            "probe cannot start: [Errno 98] cannot serve /metrics on 127.0.0.1:1: Address already in use",
        ),
        ("kafka", "probe cannot start: no broker"),
    ],
)
def test_a_start_that_fails_exits_1_and_closes_what_it_opened(
    capsys: pytest.CaptureFixture[str], fail: str, message: str
) -> None:
    made: list[Probe] = []
    assert run(made, fail=fail) == 1
    assert made[0].seen == ["built", "start", "closed"]  # never run, never "stopped"
    assert said(capsys, "error") == [("services.probe", message)]


def test_the_cannot_start_wording_is_the_service_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([], fail="start", cannot_start="cannot start the mock fleet") == 1
    ((_, error),) = said(capsys, "error")
    assert error.startswith("cannot start the mock fleet: [Errno 98]")


def test_the_service_skeleton_restores_the_signal_handlers() -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert run([]) == 0
    assert signal.getsignal(signal.SIGTERM) is before

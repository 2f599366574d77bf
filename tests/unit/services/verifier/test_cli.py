"""The verifier's commands end to end on fakes: identity, describe, snapshot, diff, audit's report and exit
status, its typed settings (the topic and the broker's wait), and hostile arguments (hypothesis too)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.verifier import __main__ as cli
from services.verifier import build, chainlog
from services.verifier.chainlog import MemoryChain
from services.verifier.settings import VerifierSettings, load_verifier_settings
from shared.contract.chain import ChainEntry, verify_chain
from shared.contract.models_verify import Outcome, RecordKind
from shared.gpu.gpu_identity import GpuUnavailableError, NvmlReader
from shared.plumbing.errors import ConfigError
from tests.helpers.verifier_fakes import UUIDS, FakeNvml


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """This machine's GPUs, as the commands find them: two fake H100s."""
    fake = FakeNvml()
    monkeypatch.setattr(cli, "open_reader", lambda: NvmlReader(fake))
    return fake


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> Any:
        raise GpuUnavailableError("NVML: no driver; nvidia-smi: not found")

    monkeypatch.setattr(cli, "open_reader", refuse)


# ---------------------------------------------------------------- identity, describe, snapshot, diff


def test_identity_prints_every_gpu(nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--hostname", "node-9", "identity"]) == 0
    identity = json.loads(capsys.readouterr().out)
    assert identity["hostname"] == "node-9"
    assert [g["uuid"] for g in identity["gpus"]] == UUIDS


def test_identity_without_a_gpu_gives_host_facts_and_exit_1(
    no_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "identity.json"
    assert cli.main(["--hostname", "node-9", "identity", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["gpus"] == []
    assert "no GPU could be read" in capsys.readouterr().err


def test_describe_from_an_identity_file_with_known_fields(
    nvml: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    identity = tmp_path / "identity.json"
    assert cli.main(["identity", "--out", str(identity)]) == 0
    out = tmp_path / "system.json"
    code = cli.main(["describe", "--identity", str(identity), "--set", "division=closed", "--out", str(out)])
    assert code == 0
    system = json.loads(out.read_text())
    assert system["division"] == "closed"
    assert system["accelerators_per_node"] == 2


def test_describe_refuses_a_set_without_a_value(nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["describe", "--set", "division"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_describe_of_a_file_that_is_not_an_identity_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": "many"}')
    assert cli.main(["describe", "--identity", str(bad)]) == 2
    assert "describe: cannot run" in capsys.readouterr().err
    assert cli.main(["describe", "--identity", str(tmp_path / "missing.json")]) == 2


def test_snapshot_then_diff_of_a_quiet_machine_is_trusted(
    nvml: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert cli.main(["snapshot", "--out", str(before), "--window-s", "0"]) == 0
    assert cli.main(["snapshot", "--out", str(after), "--window-s", "0"]) == 0
    assert cli.main(["diff", str(before), str(after)]) == 0
    nvml.driver = "555.1"  # the driver changed under the run
    assert cli.main(["snapshot", "--out", str(after), "--window-s", "0"]) == 0
    capsys.readouterr()
    assert cli.main(["diff", str(before), str(after)]) == 1
    assert "driver_version" in capsys.readouterr().out


def test_snapshot_without_a_gpu_fails(
    no_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["snapshot", "--out", str(tmp_path / "s.json")]) == 1
    assert "snapshot: FAIL" in capsys.readouterr().err


def test_diff_of_a_tampered_snapshot_cannot_run(
    nvml: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = tmp_path / "s.json"
    assert cli.main(["snapshot", "--out", str(snap), "--window-s", "0"]) == 0
    value = json.loads(snap.read_text())
    value["gpus"][0]["memory_used_mib"] = "lots"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(value))
    assert cli.main(["diff", str(snap), str(bad)]) == 2
    assert "diff: cannot run" in capsys.readouterr().err


# ---------------------------------------------------------------- audit's report


def _entries(n: int) -> list[ChainEntry]:
    chain = MemoryChain()
    for i in range(n):
        check = {"kind": RecordKind.COMPUTE_CHECK, "hostname": "n", "verifier_id": "n", "device": "cuda:0"}
        chain.append({**check, "gpu_uuid": UUIDS[i % 2], "name": f"op-{i}", "outcome": Outcome.PASS})
    return chain.entries()


class TopicRead:
    """The audit's read of the topic, faked: the entries it finds, and each (topic, timeout) it was asked."""

    def __init__(self) -> None:
        self.entries: list[ChainEntry] = []
        self.calls: list[tuple[str, float]] = []

    def __call__(self, settings: Any, topic: str, timeout_s: float) -> Any:
        self.calls.append((topic, timeout_s))
        return verify_chain(self.entries)


@pytest.fixture
def topic_read(monkeypatch: pytest.MonkeyPatch) -> TopicRead:
    read = TopicRead()
    monkeypatch.setattr(chainlog, "audit_topic", read)
    return read


def test_audit_of_an_intact_chain_names_each_head_and_exits_0(
    topic_read: TopicRead, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic_read.entries = _entries(5)
    monkeypatch.setenv("GPUHEALTH_TOPICS__VERIFICATIONS", "audit-log")
    assert cli.main(["audit"]) == 0
    out = capsys.readouterr().out
    assert "audit of audit-log: 5 record(s), 2 GPU chain(s)" in out
    assert f"{UUIDS[0]}: 3 record(s)" in out
    assert "audit: INTACT" in out
    assert topic_read.calls == [("audit-log", 60.0)]


def test_audit_of_a_broken_chain_names_the_first_break_and_the_others(
    topic_read: TopicRead, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    e = _entries(8)  # GPU 0 at 0, 2, 4, 6; GPU 1 at 1, 3, 5, 7
    topic_read.entries = [e[0], e[1], e[4], e[3], e[6], e[7]]  # each GPU lost one record
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", "5")
    assert cli.main(["audit", "--topic", "other"]) == 1
    out = capsys.readouterr().out
    assert f"audit: BROKEN, first broken link: {UUIDS[0]} at partition 0 offset 4" in out
    assert f"also broken: {UUIDS[1]} at partition 0 offset 7" in out
    assert topic_read.calls == [("other", 5.0)]


def test_audit_timeout_flag_overrides_the_setting(
    topic_read: TopicRead, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", "5")
    assert cli.main(["audit", "--timeout-s", "7"]) == 0
    assert topic_read.calls == [("gpu-verifications", 7.0)]


# ---------------------------------------------------------------- settings


def test_the_topic_comes_from_the_topics_settings_not_a_second_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert build.topic_of(VerifierSettings()) == "gpu-verifications"
    monkeypatch.setenv("GPUHEALTH_TOPICS__VERIFICATIONS", "elsewhere")
    settings = load_verifier_settings()
    assert build.topic_of(settings) == "elsewhere"
    assert build.topic_of(settings, "given") == "given"


@pytest.mark.parametrize("value", ["0", "-1", "3601", "soon", "nan"])
def test_an_invalid_wait_is_refused_with_its_variable_named(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", value)
    with pytest.raises(ConfigError, match="GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S"):
        load_verifier_settings()


def test_not_publishing_reads_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", "soon")
    assert isinstance(build.build_chain(publish=False), MemoryChain)
    with pytest.raises(ConfigError):
        build.build_chain(publish=True)


def test_an_invalid_setting_stops_an_audit_with_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", "soon")
    assert cli.main(["audit"]) == 1
    assert "ConfigError" in capsys.readouterr().err


# ---------------------------------------------------------------- hostile arguments


@pytest.mark.parametrize(
    "argv",
    [
        ["compute", "--shape", "4x4"],
        ["compute", "--shape", "0x4x4"],
        ["compute", "--shape", "65537x1x1"],
        ["compute", "--rtol", "nan"],
        ["compute", "--rtol", "2"],
        ["compute", "--min-speedup", "-1"],
        ["compute", "--size", "0"],
        ["compute", "--repeats", "0"],
        ["compute", "--dtype", "int8"],
        ["audit", "--timeout-s", "0.5"],
        ["snapshot"],
        ["nothing"],
    ],
)
def test_bad_arguments_exit_2_before_anything_runs(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2


@given(st.text(max_size=30))
def test_any_shape_text_is_a_shape_or_refused(text: str) -> None:
    try:
        m, k, n = cli._shape(text)
    except argparse.ArgumentTypeError:
        return
    assert all(0 < d <= 65536 for d in (m, k, n))


@given(st.text(max_size=30) | st.floats().map(str))
def test_any_bounded_number_text_is_within_bounds_or_refused(text: str) -> None:
    parse = cli._bounded(0, 1)
    try:
        value = parse(text)
    except argparse.ArgumentTypeError:
        return
    assert 0 <= value <= 1


# ---------------------------------------------------------------- log_operation's chain


def test_oplog_to_kafka_appends_to_the_settings_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.verifier import oplog
    from tests.helpers.verifier_fakes import FakeBackend

    opened: list[tuple[str, float]] = []

    def chain_on(settings: VerifierSettings, topic: str | None = None) -> MemoryChain:
        opened.append((build.topic_of(settings, topic), settings.verifier.kafka_timeout_s))
        return MemoryChain()

    monkeypatch.setattr(oplog, "find_backend", lambda name: (FakeBackend(gpus=1), []))
    monkeypatch.setattr(build, "kafka_chain", chain_on)
    monkeypatch.setenv("GPUHEALTH_TOPICS__VERIFICATIONS", "ops")
    monkeypatch.setenv("GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S", "9")
    log = oplog.OperationLog.to_kafka()
    assert opened == [("ops", 9.0)]
    assert [d.uuid for d in log.devices] == UUIDS[:1]
    oplog.OperationLog.to_kafka(topic="given")
    assert opened[-1] == ("given", 9.0)


def test_oplog_to_kafka_without_a_gpu_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.verifier import oplog

    monkeypatch.setattr(oplog, "find_backend", lambda name: (None, ["torch: not installed"]))
    with pytest.raises(RuntimeError, match="no GPU backend: torch: not installed"):
        oplog.OperationLog.to_kafka()

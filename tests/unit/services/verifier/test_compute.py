"""The compute check's verdicts (fake backend), the CLI's exit codes, and log_operation's records."""

from __future__ import annotations

import importlib
import json
from typing import Any

import numpy as np
import pytest

from services.verifier import __main__ as cli
from services.verifier import backends
from services.verifier.backends import Device
from services.verifier.chainlog import MemoryChain
from services.verifier.compute import MatmulSpec, check_device, reference, round_to, summarize
from services.verifier.oplog import OperationLog, where_is
from shared.contract.chain import GENESIS, link_of, verify_chain
from shared.contract.models_verify import Outcome, RecordKind, record_json
from tests.helpers.verifier_fakes import UUIDS, FakeBackend

SPEC = MatmulSpec(m=64, k=48, n=32, warmup=1, repeats=3)


@pytest.fixture(scope="module")
def ref() -> Any:
    return reference(SPEC)


def test_correct_and_fast_passes(ref: Any) -> None:
    backend = FakeBackend(device_ms=ref.cpu_ms / 10)
    result = check_device(backend, backend.devices()[0], ref, SPEC)
    assert result.outcome is Outcome.PASS
    assert result.reason is None
    assert result.speedup == pytest.approx(10)
    assert result.max_rel_err is not None
    assert result.max_rel_err < SPEC.tolerance
    assert result.result is not None
    assert result.result.shape == [64, 32]
    assert result.result.finite


def test_wrong_result_fails_with_the_error_named(ref: Any) -> None:
    backend = FakeBackend(device_ms=ref.cpu_ms / 10, corrupt=1.0)
    result = check_device(backend, backend.devices()[0], ref, SPEC)
    assert result.outcome is Outcome.WRONG_RESULT
    assert "exceeds the tolerance 0.0001" in (result.reason or "")


def test_nan_in_the_result_is_a_wrong_result(ref: Any) -> None:
    backend = FakeBackend(device_ms=ref.cpu_ms / 10, nan=True)
    result = check_device(backend, backend.devices()[0], ref, SPEC)
    assert result.outcome is Outcome.WRONG_RESULT
    assert "NaN" in (result.reason or "")
    assert result.result is not None
    assert not result.result.finite
    assert result.result.sum is None


def test_correct_but_too_slow_fails(ref: Any) -> None:
    backend = FakeBackend(device_ms=ref.cpu_ms / 1.5)  # 1.5x: below the 2x required
    result = check_device(backend, backend.devices()[0], ref, SPEC)
    assert result.outcome is Outcome.TOO_SLOW
    assert "1.50x" in (result.reason or "")
    assert "at least 2x" in (result.reason or "")


def test_the_required_speedup_is_configurable(ref: Any) -> None:
    lenient = MatmulSpec(m=64, k=48, n=32, warmup=1, repeats=3, min_speedup=1.2)
    backend = FakeBackend(device_ms=ref.cpu_ms / 1.5)
    assert check_device(backend, backend.devices()[0], ref, lenient).outcome is Outcome.PASS


def test_the_tolerance_is_configurable(ref: Any) -> None:
    loose = MatmulSpec(m=64, k=48, n=32, warmup=1, repeats=3, rtol=0.9)
    backend = FakeBackend(device_ms=ref.cpu_ms / 10, corrupt=1.0)
    assert check_device(backend, backend.devices()[0], ref, loose).outcome is Outcome.PASS


def test_a_backend_exception_is_an_error_verdict(ref: Any) -> None:
    backend = FakeBackend(fail=RuntimeError("CUDA error: an illegal memory access"))
    result = check_device(backend, backend.devices()[0], ref, SPEC)
    assert result.outcome is Outcome.ERROR
    assert "illegal memory access" in (result.reason or "")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_are_rounded_the_same_on_both_sides(dtype: str) -> None:
    values = np.random.default_rng(1).uniform(-1, 1, 1000)
    rounded = round_to(values, dtype)
    assert rounded.dtype == np.float32
    assert np.array_equal(round_to(rounded, dtype), rounded)  # idempotent: already representable
    bits = rounded.view(np.uint32)
    if dtype == "bfloat16":
        assert not (bits & 0xFFFF).any()
    assert np.abs(rounded - values).max() < (1e-3 if dtype == "float16" else 1e-2)


def test_summarize_reports_shape_stats_and_a_digest() -> None:
    s = summarize(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert (s.shape, s.dtype, s.finite, s.sum, s.min, s.max) == ([2, 3], "float32", True, 15.0, 0.0, 5.0)
    assert s.sha256 == summarize(np.arange(6, dtype=np.float32).reshape(2, 3)).sha256


# ---------------------------------------------------------------- the command line


def _records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_cli_no_gpu_fails_clearly_and_never_falls_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(backends, "find_backend", lambda name: (None, ["torch: not installed"]))
    assert cli.main(["compute", "--no-publish"]) == 1
    out = capsys.readouterr().out
    assert "FAIL, no GPU to check: torch: not installed" in out
    assert "never falls back" in out


def test_find_backend_without_any_gpu_stack_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", missing)
    found, reasons = backends.find_backend("auto")
    assert found is None
    assert reasons == ["torch: not installed", "cupy: not installed"]


@pytest.mark.parametrize(
    ("backend_kwargs", "code", "outcome"),
    [
        ({"device_ms": 1e-6}, 0, "pass"),
        ({"device_ms": 1e6}, 1, "too_slow"),
        ({"corrupt": 5.0}, 1, "wrong_result"),
    ],
)
def test_cli_compute_exit_code_follows_the_verdict(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    backend_kwargs: dict[str, Any],
    code: int,
    outcome: str,
) -> None:
    backend = FakeBackend(gpus=2, **backend_kwargs)
    monkeypatch.setattr(backends, "find_backend", lambda name: (backend, []))
    assert cli.main(["compute", "--no-publish", "--json", "--size", "40", "--repeats", "2"]) == code
    records = _records(capsys.readouterr().out)
    assert [r["gpu_uuid"] for r in records] == UUIDS[:2]
    assert {r["outcome"] for r in records} == {outcome}
    assert all(r["kind"] == "compute_check" and r["input_shape"] == [40, 40, 40] for r in records)
    assert all(r["rtol"] == 1e-4 and r["min_speedup"] == 2.0 for r in records)
    assert all(r["seq"] == 0 and r["prev_sha256"] == GENESIS for r in records)


# ---------------------------------------------------------------- log_operation


class FakeTensor:
    """Just enough of a torch tensor: a device, and the data behind it."""

    def __init__(self, data: np.ndarray, kind: str = "cuda", index: int | None = 0) -> None:
        self.data, self.device = data, type("Dev", (), {"type": kind, "index": index})()

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        return self.data

    @property
    def dtype(self) -> str:
        return f"torch.{self.data.dtype}"


def _oplog(synced: list[str]) -> tuple[OperationLog, MemoryChain]:
    chain = MemoryChain()
    devices = [Device(i, UUIDS[i], "Fake H100") for i in range(2)]
    return OperationLog(
        chain, devices=devices, hostname="n1", synchronize=lambda: synced.append("sync")
    ), chain


def test_log_operation_records_device_timing_and_result_and_chains_them() -> None:
    synced: list[str] = []
    oplog, chain = _oplog(synced)
    out = oplog.log_operation("scale", (2, 2), lambda: FakeTensor(np.full((2, 2), 3.0), index=1))
    assert isinstance(out, FakeTensor)
    assert synced == ["sync", "sync"]
    oplog.log_operation("again", (2,), lambda: FakeTensor(np.ones(2), index=1))
    first, second = chain.records
    assert first.kind is RecordKind.OPERATION
    assert first.outcome is Outcome.RECORDED
    assert (first.gpu_uuid, first.device, first.input_shape, first.name) == (
        UUIDS[1],
        "cuda:1",
        [2, 2],
        "scale",
    )
    assert first.result is not None
    assert first.result.sum == 12.0
    assert first.device_ms is not None
    assert second.seq == 1
    assert second.prev_sha256 == link_of(record_json(first))
    assert verify_chain(chain.entries()).intact


def test_log_operation_flags_a_result_that_stayed_on_the_cpu() -> None:
    oplog, chain = _oplog([])
    oplog.log_operation("fallback", (3,), lambda: np.ones(3))
    (record,) = chain.records
    assert record.outcome is Outcome.ERROR
    assert "did not run on the GPU" in (record.reason or "")
    assert record.device == "cpu"
    assert record.gpu_uuid == UUIDS[0]


def test_log_operation_records_the_exception_and_raises_it() -> None:
    oplog, chain = _oplog([])

    def boom() -> None:
        raise MemoryError("CUDA out of memory")

    with pytest.raises(MemoryError):
        oplog.log_operation("oom", (1 << 20,), boom)
    assert chain.records[0].outcome is Outcome.ERROR
    assert "out of memory" in (chain.records[0].reason or "")


def test_where_is_reads_torch_cupy_and_numpy_results() -> None:
    assert where_is(FakeTensor(np.ones(1), index=3)) == ("cuda", 3)
    assert where_is((FakeTensor(np.ones(1), index=2), "aux")) == ("cuda", 2)
    assert where_is({"logits": FakeTensor(np.ones(1), kind="cpu", index=None)}) == ("cpu", None)
    assert where_is(np.ones(2)) == ("cpu", None)

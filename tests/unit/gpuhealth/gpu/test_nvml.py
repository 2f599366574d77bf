"""The one NVML session: init and shutdown balanced, and every query either answered or None."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.gpu.nvml import NvmlSession
from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import SourceError
from services.collector.proc_info import ProcReader
from services.collector.process_sources import NvmlProcesses
from shared.fakes.nvml import FakeNvml, NVMLError, NVMLError_GpuIsLost, NVMLError_NotSupported
from shared.gpu.gpu_identity import GpuUnavailableError, NvmlReader


class _Module:
    """A pynvml stand-in whose init, count and handle queries fail where a test says."""

    NVMLError = NVMLError

    def __init__(self, *, fail: str = "", gpus: int = 2) -> None:
        self.fail, self.gpus = fail, gpus
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise NVMLError_NotSupported(name)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return 100 + i


def test_a_session_takes_every_handle_and_shuts_down_once_however_often_it_is_closed() -> None:
    module = _Module(gpus=3)
    session = NvmlSession(module)
    assert session.handles == [100, 101, 102]
    session.close()
    session.close()
    assert module.calls.count("nvmlInit") == module.calls.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("fail", "shutdowns"), [("nvmlInit", 0), ("nvmlDeviceGetCount", 1), ("nvmlDeviceGetHandleByIndex", 1)]
)
def test_nvml_that_cannot_start_is_a_source_error_and_leaves_no_init_behind(
    fail: str, shutdowns: int
) -> None:
    module = _Module(fail=fail)
    with pytest.raises(SourceError, match="NVML is not usable here"):
        NvmlSession(module)
    assert module.calls.count("nvmlShutdown") == shutdowns  # an init that succeeded is balanced


def test_no_pynvml_module_is_a_source_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(SourceError, match="nvidia-ml-py"):
        NvmlSession()


Answer = st.one_of(
    st.tuples(st.just("value"), st.integers() | st.binary(max_size=8) | st.none()),
    st.tuples(
        st.just("nvml error"), st.sampled_from([NVMLError, NVMLError_NotSupported, NVMLError_GpuIsLost])
    ),
    st.tuples(st.just("missing"), st.none()),
    st.tuples(st.just("bug"), st.sampled_from([TypeError, KeyError, RuntimeError])),
)


@given(
    answers=st.dictionaries(st.sampled_from(["nvmlDeviceGetA", "nvmlDeviceGetB", "nvmlSystemGetC"]), Answer)
)
def test_a_query_is_its_answer_or_none_where_nvml_cannot_answer_and_a_bug_still_raises(
    answers: dict[str, tuple[str, Any]],
) -> None:
    module = _Module()

    def function(kind: str, what: Any) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            assert (args, kwargs) == ((100, 7), {"version": 2})
            if kind == "value":
                return what
            raise what("from the fake")

        return call

    for name, (kind, what) in answers.items():
        if kind != "missing":
            setattr(module, name, function(kind, what))
    session = NvmlSession(module)
    for name in ("nvmlDeviceGetA", "nvmlDeviceGetB", "nvmlSystemGetC"):
        kind, what = answers.get(name, ("missing", None))
        if kind == "bug":
            with pytest.raises(what):
                session.query(name, 100, 7, version=2)
        else:
            assert session.query(name, 100, 7, version=2) == (what if kind == "value" else None)


def _reader(kind: str, fake: FakeNvml, tmp_path: Path) -> Any:
    if kind == "metrics":
        return NvmlSource(fake, pcie_sampler=False)
    if kind == "processes":
        return NvmlProcesses(fake, ProcReader(tmp_path))
    return NvmlReader(fake)


@pytest.mark.parametrize("kind", ["metrics", "processes", "identity"])
def test_each_nvml_reader_inits_once_and_shuts_down_once(kind: str, tmp_path: Path) -> None:
    fake = FakeNvml()
    reader = _reader(kind, fake, tmp_path)
    reader.close()
    reader.close()
    assert fake.calls.count("nvmlInit") == fake.calls.count("nvmlShutdown") == 1
    assert fake.calls.count("nvmlEventSetFree") <= 1


def test_the_identity_reader_says_gpu_unavailable_where_nvml_cannot_start() -> None:
    with pytest.raises(GpuUnavailableError, match="NVML is not usable here"):
        NvmlReader(_Module(fail="nvmlInit"))


def test_a_gpu_that_stops_answering_drops_out_of_each_reader_instead_of_failing_it(tmp_path: Path) -> None:
    fake = FakeNvml()
    fake.lost.add(1)
    assert [g.index for g in NvmlSource(fake, pcie_sampler=False).read().gpus] == [0]
    assert [g.gpu_index for g in NvmlProcesses(fake, ProcReader(tmp_path)).read()] == [0]

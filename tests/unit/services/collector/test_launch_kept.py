"""A process's launch is read once per process: pids reused, processes that exec or exit, on a fake /proc."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector import proc_info
from services.collector.launcher import Launch
from services.collector.proc_info import ProcReader
from services.collector.process_sources import NvmlProcesses

LAUNCHER_PID = 50
JOBS = ("job-a", "job-b", "job-c")


@dataclass
class FakeProc:
    """A /proc tree in a folder: a torchrun agent and the workers below it, as the test makes them."""

    root: Path
    ticks: int = 1
    live: dict[int, tuple[int, str, str]] = field(default_factory=dict)  # pid: (start, comm, job)

    def __post_init__(self) -> None:
        (self.root / "stat").write_text("cpu  1 2 3\nbtime 1763800000\n")
        self._write(LAUNCHER_PID, ppid=1, start=0, comm="torchrun", job=None)
        (self.root / str(LAUNCHER_PID) / "cmdline").write_bytes(
            b"/usr/bin/python3\0/usr/bin/torchrun\0a.py\0"
        )

    def _write(self, pid: int, *, ppid: int, start: int, comm: str, job: str | None) -> None:
        base = self.root / str(pid)
        base.mkdir(exist_ok=True)
        fields = ["S", str(ppid), *["0"] * 17, str(start), "0", "0"]
        (base / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (base / "cmdline").write_bytes(f"{comm}\0train.py\0".encode())
        env = {"PATH": "/usr/bin", "HF_TOKEN": "secret"}
        if job is not None:
            env |= {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": job}
        (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))

    def spawn(self, pid: int, job: str, comm: str = "python3") -> None:
        """A new process at `pid` (a reused one, when a process had it before): started after all before."""
        self.ticks += 1
        self.live[pid] = (self.ticks, comm, job)
        self._write(pid, ppid=LAUNCHER_PID, start=self.ticks, comm=comm, job=job)

    def exec(self, pid: int, job: str) -> None:
        """The process runs another program: the same pid and start time, a new name and environment.

        (An exec of a program of the same name is not seen: /proc/PID/stat does not change.)"""
        self.ticks += 1
        start, _, _ = self.live[pid]
        renamed = f"prog-{self.ticks}"
        self.live[pid] = (start, renamed, job)
        self._write(pid, ppid=LAUNCHER_PID, start=start, comm=renamed, job=job)

    def exit(self, pid: int) -> None:
        self.live.pop(pid, None)
        shutil.rmtree(self.root / str(pid), ignore_errors=True)


@contextmanager
def fake_proc() -> Iterator[FakeProc]:
    with tempfile.TemporaryDirectory() as folder:
        yield FakeProc(Path(folder))


def count_reads(patch: pytest.MonkeyPatch) -> list[Path]:
    """Every environment read from /proc from now on, and every command line read, by path."""
    seen: list[Path] = []
    read_environ, read = proc_info._read_environ, proc_info._read

    def counted_environ(path: Path) -> bytes:
        seen.append(path)
        return read_environ(path)

    def counted(path: Path) -> bytes | None:
        if path.name == "cmdline":
            seen.append(path)
        return read(path)

    patch.setattr(proc_info, "_read_environ", counted_environ)
    patch.setattr(proc_info, "_read", counted)
    return seen


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    return count_reads(monkeypatch)


def launch_reads(seen: list[Path]) -> tuple[int, int]:
    """(environments read, the launcher's command line read: once per walk up the tree)."""
    return (
        sum(p.name == "environ" for p in seen),
        sum(p == p.parent.parent / str(LAUNCHER_PID) / "cmdline" for p in seen),
    )


PIDS = st.sampled_from([100, 101, 102])  # few, so pids are reused often
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("spawn"), PIDS, st.sampled_from(JOBS)),
        st.tuples(st.just("exec"), PIDS, st.sampled_from(JOBS)),
        st.tuples(st.just("exit"), PIDS, st.just("")),
        st.tuples(st.just("poll"), st.just(0), st.just("")),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_each_process_is_read_once_however_pids_are_reused(steps: list[tuple[str, int, str]]) -> None:
    """Polls between spawns (a pid reused by a younger process), execs and exits: every poll's launches are
    what a fresh read finds, a process's environment and tree are read on the first poll that sees it only,
    and nothing is kept of a process a poll no longer saw."""
    with pytest.MonkeyPatch.context() as patch, fake_proc() as proc:
        seen = count_reads(patch)
        reader = ProcReader(proc.root, hostname="h")
        known: dict[int, tuple[int, str, str]] = {}  # what the reader should keep after the last poll
        for op, pid, job in [*steps, ("poll", 0, "")]:
            if op == "spawn":
                proc.exit(pid)
                proc.spawn(pid, job)
            elif op == "exec" and pid in proc.live:
                proc.exec(pid, job)
            elif op == "exit":
                proc.exit(pid)
            elif op == "poll":
                seen.clear()
                launches = {pid: reader.read(pid).launch for pid in proc.live}
                reader.retain(proc.live)
                fresh = [p for p, identity in proc.live.items() if known.get(p) != identity]
                assert sorted(int(p.parent.name) for p in seen if p.name == "environ") == sorted(fresh)
                assert launch_reads(seen) == (len(fresh), len(fresh))  # one walk up the tree each
                assert launches == {
                    p: Launch("torchrun", f"elastic:{j}", None, 0, 2) for p, (_, _, j) in proc.live.items()
                }
                assert reader._launches.keys() == proc.live.keys()
                known = dict(proc.live)


def test_a_kept_launch_reads_neither_the_environment_nor_the_tree_again(
    tmp_path: Path, reads: list[Path]
) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(100, "job-a")
    reader = ProcReader(tmp_path, hostname="h")
    first = reader.read(100)
    assert launch_reads(reads) == (1, 1)
    reads.clear()
    for _ in range(5):
        assert reader.read(100) == first
    assert launch_reads(reads) == (0, 0)  # its own command line is still read each poll: it may change


def test_a_pid_reused_while_it_was_read_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stat said one process, the environment came from the next one at that pid: read again next poll."""
    proc = FakeProc(tmp_path)
    proc.spawn(100, "job-a")
    read_environ = proc_info._read_environ
    swaps: list[int] = []

    def reused_meanwhile(path: Path) -> bytes:
        if not swaps:
            swaps.append(1)
            proc.exit(100)
            proc.spawn(100, "job-b")
        return read_environ(path)

    monkeypatch.setattr(proc_info, "_read_environ", reused_meanwhile)
    reader = ProcReader(tmp_path, hostname="h")
    reader.read(100)
    assert 100 not in reader._launches
    launch = reader.read(100).launch
    assert launch is not None
    assert launch.job_key == "elastic:job-b"
    assert 100 in reader._launches


def test_what_proc_refused_is_kept_but_a_process_gone_is_not(tmp_path: Path, reads: list[Path]) -> None:
    proc = FakeProc(tmp_path)
    proc.spawn(100, "job-a")
    (tmp_path / "100" / "environ").unlink()
    (tmp_path / "100" / "environ").mkdir()  # reading it fails as a permission refusal would: an OSError
    reader = ProcReader(tmp_path, hostname="h")
    assert reader.read(100).launch_note is not None
    reads.clear()
    assert reader.read(100).launch_note is not None
    assert launch_reads(reads) == (0, 0)
    proc.exit(100)
    assert "gone" in (reader.read(100).launch_note or "")
    assert 100 not in reader._launches


def test_a_reader_never_told_what_to_retain_keeps_a_bounded_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proc_info, "MAX_KEPT", 3)
    proc = FakeProc(tmp_path)
    reader = ProcReader(tmp_path, hostname="h")
    for pid in range(100, 110):
        proc.spawn(pid, "job-a")
        reader.read(pid)
    assert list(reader._launches) == [107, 108, 109]  # the oldest went first


def test_the_nvml_listing_forgets_the_processes_that_left_the_gpus(tmp_path: Path, reads: list[Path]) -> None:
    proc = FakeProc(tmp_path)
    for pid in (100, 101):
        proc.spawn(pid, "job-a")
    on_gpu = [SimpleNamespace(pid=100, usedGpuMemory=2**30), SimpleNamespace(pid=101, usedGpuMemory=2**30)]
    nvml = SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: b"GPU-8b08f602-b857-81e9-a86b-547a202d628f",
        nvmlDeviceGetComputeRunningProcesses=lambda h: list(on_gpu),
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetProcessUtilization=lambda h, since: [],
    )
    reader = ProcReader(tmp_path, hostname="h")
    source = NvmlProcesses(nvml, reader)
    source.read()
    source.read()
    assert launch_reads(reads) == (2, 2)  # once each, not once a poll
    on_gpu.pop()  # 101 left the GPU (it still runs)
    source.read()
    assert set(reader._launches) == {100}
    on_gpu.append(SimpleNamespace(pid=101, usedGpuMemory=2**30))
    source.read()
    assert launch_reads(reads) == (3, 3)  # back on the GPU: read again

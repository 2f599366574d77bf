"""Jobs as launchers leave them: environ blobs and process trees, hostile and real."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector.launcher import (
    ENVIRON_MAX,
    MAX_DEPTH,
    WANTED,
    Launch,
    LaunchError,
    Stat,
    launch_from,
    parents,
    parse_environ,
    parse_stat,
)
from services.collector.proc_info import ProcReader
from services.collector.process_sources import ObservedProcess
from services.collector.processes import classify_process
from shared.contract.models_workload import GpuProcess, ProcessClass
from shared.gpu.process_rules import ProcessRules
from shared.plumbing.errors import ConfigError

TORCHRUN_ENV = {"LOCAL_RANK": "3", "RANK": "11", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                "TORCHELASTIC_RUN_ID": "llm-pretrain-7", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
                "HF_TOKEN": "secret"}  # fmt: skip


def blob(env: dict[str, str]) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def test_a_torchrun_worker_names_its_launcher_job_and_ranks() -> None:
    env = parse_environ(blob(TORCHRUN_ENV))
    assert "HF_TOKEN" not in env  # the environment's secrets are never kept
    launch = launch_from(env, ["/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 a.py"], "h1")
    assert launch == Launch("torchrun", "elastic:llm-pretrain-7", 11, 3, 16)


@pytest.mark.parametrize(
    ("parent", "launcher"),
    [
        ("python -u -m deepspeed.launcher.launch --world_info=eyJ --node_rank=0 train.py", "deepspeed"),
        ("/opt/venv/bin/python /opt/venv/bin/accelerate launch --multi_gpu x.py", "accelerate"),
        ("python -m torch.distributed.run --nproc_per_node=2 x.py", "torchrun"),
        ("python -m torch.distributed.launch --use_env x.py", "torchrun"),
        ("bash run.sh", None),  # rank variables, no launcher known: a job key, no classification
    ],
)
def test_the_nearest_launcher_parent_names_the_launcher(parent: str, launcher: str | None) -> None:
    env = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29400"}
    launch = launch_from(env, [parent, "/sbin/init"], "h1")
    assert launch is not None
    assert launch.launcher == launcher
    assert launch.job_key == "master:10.1.2.3:29400"


def test_torchruns_default_run_id_is_no_id_and_a_loopback_master_is_the_hosts() -> None:
    env = {"LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    launch = launch_from(env, [], "gpu-node-07")
    assert launch is not None
    assert launch.launcher == "torchrun"  # only torchrun sets TORCHELASTIC_RUN_ID
    assert launch.job_key == "master:gpu-node-07/127.0.0.1:29500"
    accelerate = launch_from(
        {"LOCAL_RANK": "0", "WORLD_SIZE": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}, [], "h"
    )
    assert accelerate == Launch("accelerate", None, None, 0, 1)


def test_no_rank_variables_is_no_launch() -> None:
    assert launch_from({"PATH": "/usr/bin"}, ["torchrun x.py"], "h") is None
    assert launch_from({"LOCAL_RANK": "0"}, [], "h") is None


@pytest.mark.parametrize(
    "env",
    [
        {"LOCAL_RANK": "-1", "WORLD_SIZE": "2"},
        {"LOCAL_RANK": "0", "WORLD_SIZE": "0"},
        {"LOCAL_RANK": "x", "WORLD_SIZE": "2"},
        {"LOCAL_RANK": "٣", "WORLD_SIZE": "8"},  # a digit, but not an ASCII one
        {"LOCAL_RANK": "4", "WORLD_SIZE": "2"},
        {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "2"},
        {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"},
        {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "a b"},
        {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x" * 201},
    ],
)
def test_malformed_launcher_variables_are_a_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(LaunchError, match=r"\w"):
        launch_from(env, [], "h")


def test_a_huge_environ_is_cut_at_its_last_whole_entry() -> None:
    head = blob({"LOCAL_RANK": "0", "WORLD_SIZE": "4"})
    filler = blob({f"PAD{i}": "x" * 1000 for i in range(ENVIRON_MAX // 1000 + 10)})
    env = parse_environ(head + filler + blob({"RANK": "3", "TORCHELASTIC_RUN_ID": "late"}))
    assert env == {"LOCAL_RANK": "0", "WORLD_SIZE": "4"}  # what lies past the limit is not read


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=4000),  # anything, NULs or none, UTF-8 or not
    st.lists(st.tuples(st.sampled_from([*sorted(WANTED), "ACCELERATE_X", "PATH", ""]),
                       st.binary(max_size=300)), max_size=20).map(
        lambda pairs: b"\0".join(k.encode() + b"=" + v for k, v in pairs)),
))  # fmt: skip
def test_any_environ_blob_gives_launcher_variables_or_a_clear_error(raw: bytes) -> None:
    env = parse_environ(raw)
    assert all(k in WANTED or k.startswith("ACCELERATE_") for k in env)
    assert all(len(v) <= 800 for v in env.values())
    try:
        launch = launch_from(env, [], "host-1")
    except LaunchError:
        return
    if launch is not None:  # whatever came out fits the message the collector sends
        GpuProcess.model_validate({
            "pid": 1, "type": "compute", "classification": "training", "rule": "launched-worker",
            "launcher": launch.launcher, "job_key": launch.job_key, "rank": launch.rank,
            "local_rank": launch.local_rank, "world_size": launch.world_size,
        })  # fmt: skip


# ---------------------------------------------------------------- process trees


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 40),
        st.one_of(st.none(), st.builds(Stat, ppid=st.integers(-2, 40), start_ticks=st.integers(0, 50))),
        max_size=40,
    ),
    st.integers(0, 40),
)
def test_any_process_table_gives_a_finite_honest_walk(table: dict[int, Stat | None], pid: int) -> None:
    """Cycles, reused pids (a 'parent' younger than its child), vanished processes: the walk ends."""
    found = parents(pid, table.get)
    assert len(found) <= MAX_DEPTH
    assert len(set(found)) == len(found)
    assert pid not in found
    chain = [pid, *found]
    for child, parent in itertools.pairwise(chain):
        child_stat, parent_stat = table[child], table[parent]
        assert child_stat is not None
        assert parent_stat is not None
        assert child_stat.ppid == parent
        assert parent_stat.start_ticks <= child_stat.start_ticks


def test_a_reused_parent_pid_and_a_cycle_end_the_walk() -> None:
    tree = {10: Stat(9, 500), 9: Stat(8, 400), 8: Stat(1, 100)}
    assert parents(10, tree.get) == [9, 8]
    assert parents(10, {**tree, 9: Stat(8, 900)}.get) == []  # pid 9 now is a younger process
    assert parents(10, {10: Stat(9, 5), 9: Stat(10, 5)}.get) == [9]
    assert parents(10, {10: Stat(9, 5)}.get) == []  # the parent has gone


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_stat_line_gives_a_stat_or_none(text: str) -> None:
    stat = parse_stat(text)
    assert stat is None or (stat.ppid >= 0 and stat.start_ticks >= 0)


# ---------------------------------------------------------------- this machine's real /proc

WORKER = "import time; time.sleep(60)"
LAUNCHER = (  # a real python -c launcher: starts one worker with the launcher's variables, prints its pid
    "import os, subprocess, sys; env = dict(os.environ, **dict(a.split('=', 1) for a in sys.argv[1:]));"
    f" w = subprocess.Popen([os.readlink('/proc/self/exe'), '-c', {WORKER!r}], env=env);"
    " print(w.pid, flush=True); w.wait()"
)


@pytest.fixture
def launched() -> Iterator[tuple[int, int, subprocess.Popen[str]]]:
    """(worker pid, launcher pid): torchrun's part played by a `python -c` whose argv[0] is `torchrun`."""
    launcher = subprocess.Popen(
        ["torchrun", "-c", LAUNCHER, "LOCAL_RANK=1", "RANK=5", "WORLD_SIZE=8",
         "TORCHELASTIC_RUN_ID=itest-42"],
        executable=sys.executable, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert launcher.stdout is not None
    with launcher.stdout:
        worker = int(launcher.stdout.readline() or 0)
    try:
        assert worker > 0, "the launcher started no worker"
        yield worker, launcher.pid, launcher
    finally:
        launcher.kill()
        launcher.wait()
        with contextlib.suppress(ProcessLookupError):
            if worker > 0:
                os.kill(worker, 9)


def test_a_real_launched_worker_is_training_on_its_first_poll(
    launched: tuple[int, int, subprocess.Popen[str]],
) -> None:
    worker, launcher, _ = launched
    reader = ProcReader(hostname="this-host")
    info = reader.read(worker)
    assert info.command_line is not None
    assert "train" not in info.command_line  # its name says nothing
    assert info.launch == Launch("torchrun", "elastic:itest-42", 5, 1, 8)
    assert parents(worker, reader.stat)[0] == launcher
    process = classify_process(ProcessRules.load(), ObservedProcess(pid=worker, type="compute", info=info))
    assert (process.classification, process.rule) == (ProcessClass.TRAINING, "launched-worker")
    assert (process.launcher, process.job_key, process.rank) == ("torchrun", "elastic:itest-42", 5)


def test_a_real_process_without_launcher_variables_has_no_launch() -> None:
    info = ProcReader().read(os.getpid())
    if "LOCAL_RANK" in os.environ:
        pytest.skip("the test runner itself was launched")
    assert info.launch is None
    assert info.launch_note is None


NOBODY = 65534  # nobody and nogroup on Debian


def read_as_nobody(pid: int) -> tuple[bool, str | None]:
    """(launch is None, launch note) of `pid` as a reader that has dropped root for nobody reads it: a forked
    child that gives up its groups, gid and uid (and with them every capability) before it reads /proc."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's coverage is not collected)
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            info = ProcReader().read(pid)
            os.write(write_end, json.dumps([os.geteuid(), info.launch is None, info.launch_note]).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        uid, no_launch, note = json.loads(answer.read() or b"[null, null, null]")
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged reader failed"
    assert uid == NOBODY
    return no_launch, note


def test_what_proc_refuses_is_a_reason_not_a_crash() -> None:
    """Another user's process: as root (CI), the reader drops to nobody in a child and reads a root-owned
    process of the test's; as anyone else, pid 1 (init's, or the container's entry point) is refused."""
    if os.geteuid() == 0:
        root_owned = subprocess.Popen(["sleep", "60"])
        try:
            no_launch, note = read_as_nobody(root_owned.pid)
        finally:
            root_owned.kill()
            root_owned.wait()
        assert no_launch
        assert note == "environ not readable: permission denied (another user's process)"
    else:
        try:
            Path("/proc/1/environ").read_bytes()
        except PermissionError:
            info = ProcReader().read(1)
            assert info.launch is None
            assert "permission" in (info.launch_note or "")
        else:
            pytest.skip("pid 1 is this user's own process: no other user's process to read")
    gone = ProcReader().read(2**22 + 12345)  # above pid_max: never a process
    assert gone.launch is None
    assert "gone" in (gone.launch_note or "")


def test_a_worker_that_exits_between_reads_gives_a_reason(
    launched: tuple[int, int, subprocess.Popen[str]],
) -> None:
    worker, _, launcher = launched
    launcher.kill()
    launcher.wait()
    os.kill(worker, 9)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # a zombie of init's until reaped
    info = ProcReader().read(worker)
    assert info.launch is None


@pytest.mark.parametrize("value", ['["slurm"]', '"torchrun"', "[{}]", "[1]"])
def test_a_rule_naming_an_unknown_launcher_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="launcher must be a list"):
        ProcessRules.from_toml(f'[[rule]]\nname = "w"\nclass = "training"\nlauncher = {value}\n')

"""Process facts: cgroup paths to container and pod, a recorded /proc tree, NVML lists, the mock fleet."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector.proc_info import CgroupInfo, ProcInfo, ProcReader, parse_cgroup, start_time_from_stat
from services.collector.process_sources import GpuObservation, NvmlProcesses, ObservedProcess
from services.collector.processes import process_messages
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.processes import MockProcesses
from shared.contract.models_workload import GpuProcess, ProcessClass
from shared.gpu.process_rules import ProcessRules

CID = "3f2a9c4e1b7d6a5f8e0c2b4d6f8a0c1e3b5d7f9a1c3e5b7d9f0a2c4e6b8d0f1a"
UID = "0b4b2a4e-1d7d-11e9-9a3b-42010a800002"
UID_ = UID.replace("-", "_")

# Recorded from real nodes' /proc/PID/cgroup (ids replaced by CID/UID).
RECORDED = [
    # cgroup v1, Docker
    (
        f"12:memory:/docker/{CID}\n11:devices:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
        CgroupInfo(CID, None, None),
    ),
    # cgroup v2, Docker with the systemd driver
    (f"0::/system.slice/docker-{CID}.scope\n", CgroupInfo(CID, None, None)),
    # cgroup v1, kubelet cgroupfs driver, burstable
    (
        f"11:memory:/kubepods/burstable/pod{UID}/{CID}\n4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n",
        CgroupInfo(CID, UID, "burstable"),
    ),
    # cgroup v1, guaranteed pods sit right under /kubepods
    (f"9:pids:/kubepods/pod{UID}/{CID}\n", CgroupInfo(CID, UID, "guaranteed")),
    # cgroup v2, systemd driver, containerd, besteffort
    (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        CgroupInfo(CID, UID, "besteffort"),
    ),
    # cgroup v2, systemd driver, CRI-O, burstable
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n",
        CgroupInfo(CID, UID, "burstable"),
    ),
    # cgroup v2, guaranteed
    (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        CgroupInfo(CID, UID, "guaranteed"),
    ),
    # CRI-O's conmon is the runtime's monitor: the pod, not a container
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
        CgroupInfo(None, UID, "burstable"),
    ),
    # kind: a kubelet inside a Docker container (v1 hybrid: the v2 line is empty)
    (
        f"0::/\n5:memory:/docker/{'a' * 64}/kubepods/besteffort/pod{UID}/{CID}\n",
        CgroupInfo(CID, UID, "besteffort"),
    ),
    # podman
    (
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
        CgroupInfo(CID, None, None),
    ),
    # a plain login session, and an empty file
    ("0::/user.slice/user-1000.slice/session-3.scope\n", CgroupInfo()),
    ("", CgroupInfo()),
]


@pytest.mark.parametrize(("text", "expected"), RECORDED)
def test_cgroup_paths_name_the_container_and_the_pod(text: str, expected: CgroupInfo) -> None:
    assert parse_cgroup(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_any_cgroup_text_gives_contract_valid_ids(text: str) -> None:
    info = parse_cgroup(text)
    # whatever came out must fit the message (the model refuses anything else)
    fields = {"container_id": info.container_id, "pod_uid": info.pod_uid, "qos_class": info.qos_class}
    GpuProcess.model_validate(
        {"pid": 1, "type": "compute", "classification": ProcessClass.COMPUTE, "rule": "default", **fields}
    )


def _proc_tree(root: Path) -> None:
    (root / "stat").write_text("cpu  1 2 3\nbtime 1763800000\nprocesses 9\n")
    p = root / "4242"
    p.mkdir()
    (p / "cmdline").write_bytes(b"python3\x00train.py\x00--lr\x001e-4\x00--name\x00a b\x00")
    # comm with a space and a parenthesis: the fields are counted after the last ')'
    fields = ["S", *["0"] * 18, "360000"]  # field 22 (starttime) = 360000 ticks
    (p / "stat").write_text(f"4242 (py thon) x) {' '.join(fields)} 0 0\n")
    (p / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n")
    (p / "cgroup").write_text(RECORDED[4][0])
    os.symlink("/usr/bin/python3.12", p / "exe")


def test_a_recorded_proc_tree_gives_every_fact(tmp_path: Path) -> None:
    _proc_tree(tmp_path)
    reader = ProcReader(tmp_path)
    info = reader.read(4242)
    assert info.executable == "/usr/bin/python3.12"
    assert info.command_line == "python3 train.py --lr 1e-4 --name a b"
    assert info.user == "root"
    assert info.start_time == datetime.fromtimestamp(1763800000 + 360000 / reader.ticks, UTC)
    assert info.cgroup == CgroupInfo(CID, UID, "besteffort")


def test_a_vanished_process_gives_nothing_rather_than_failing(tmp_path: Path) -> None:
    _proc_tree(tmp_path)
    info = ProcReader(tmp_path).read(99999)
    assert (info.executable, info.command_line, info.user, info.start_time) == (None, None, None, None)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_start_time_from_any_stat_line_is_a_time_or_none(stat: str) -> None:
    result = start_time_from_stat(stat, 1763800000.0, 100)
    assert result is None or result.tzinfo is UTC


class _NvmlError(Exception):
    def __init__(self, value: int = 3) -> None:
        super().__init__(value)
        self.value = value


def _nvml(processes: dict[str, list[Any]], utilisation: Any) -> Any:
    def util(handle: int, since: int) -> Any:
        if isinstance(utilisation, Exception):
            raise utilisation
        return utilisation

    return SimpleNamespace(
        NVMLError=_NvmlError,
        NVML_ERROR_NOT_FOUND=6,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: b"GPU-8b08f602-b857-81e9-a86b-547a202d628f",
        nvmlDeviceGetComputeRunningProcesses=lambda h: processes["compute"],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: processes["graphics"],
        nvmlDeviceGetProcessUtilization=util,
    )


def test_nvml_lists_merge_and_utilisation_is_the_mean_since_the_last_poll(tmp_path: Path) -> None:
    _proc_tree(tmp_path)
    now_us = time.time_ns() // 1000

    def sample(pid: int, sm: int, mem: int, dt: int) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, smUtil=sm, memUtil=mem, timeStamp=now_us + dt)

    nvml = _nvml(
        {
            "compute": [
                SimpleNamespace(pid=4242, usedGpuMemory=3 * 2**30),
                SimpleNamespace(pid=7, usedGpuMemory=None),
            ],
            "graphics": [
                SimpleNamespace(pid=4242, usedGpuMemory=2**64 - 1),
                SimpleNamespace(pid=9, usedGpuMemory=512 * 2**20),
            ],
        },
        [
            sample(4242, 80, 20, 1),
            sample(4242, 40, 10, 2),
            sample(9, 101, 0, 3),
            sample(7, 10, 5, -60_000_000),
        ],
    )
    source = NvmlProcesses(nvml, ProcReader(tmp_path))
    (gpu,) = source.read()
    by_pid = {p.pid: p for p in gpu.processes}
    assert by_pid[4242].type == "compute+graphics"
    assert by_pid[4242].used_memory_mib == 3072
    assert (by_pid[4242].sm_util_pct, by_pid[4242].mem_util_pct) == (60.0, 15.0)
    assert by_pid[7].used_memory_mib is None
    assert by_pid[7].sm_util_pct == 0.0
    assert by_pid[9].type == "graphics"
    assert by_pid[9].sm_util_pct == 0.0
    (message,) = process_messages([gpu], ProcessRules.load(), source="nvml", collector_id="c", hostname="h")
    assert message.gpu_uuid == "GPU-8b08f602-b857-81e9-a86b-547a202d628f"
    assert {p.pid: p.rule for p in message.processes}[4242] == "training-script"
    assert message.processes[[p.pid for p in message.processes].index(4242)].pod_uid == UID


@pytest.mark.parametrize(("error", "expected"), [(_NvmlError(6), 0.0), (_NvmlError(3), None)])
def test_no_samples_reads_zero_but_unsupported_reads_none(
    tmp_path: Path, error: Exception, expected: Any
) -> None:
    nvml = _nvml({"compute": [SimpleNamespace(pid=4242, usedGpuMemory=2**30)], "graphics": []}, error)
    (gpu,) = NvmlProcesses(nvml, ProcReader(tmp_path)).read()
    assert gpu.processes[0].sm_util_pct == expected


def test_the_mock_fleet_runs_training_workers_in_pods() -> None:
    t = [0.0]
    fleet = Fleet(
        FleetSpec(nodes=1, gpus_per_node=8), SimClock(start_s=1_790_000_000.0, monotonic=lambda: t[0])
    )
    t[0] = 3 * 3600  # by then most GPUs have a job
    body = MockProcesses(fleet).node(0)
    busy = [g for g in body["gpus"] if g["processes"]]
    assert busy, "a simulated node three hours in runs jobs"
    node = fleet.nodes[0]
    for gpu in body["gpus"]:
        sim = next(g for g in node.gpus if g.uuid == gpu["gpu_uuid"])
        assert bool(gpu["processes"]) == (sim.job is not None)
    observed = [
        GpuObservation(
            g["gpu_uuid"],
            g["gpu_index"],
            [
                ObservedProcess(
                    pid=p["pid"],
                    type=p["type"],
                    used_memory_mib=p["used_memory_mib"],
                    sm_util_pct=p["sm_util_pct"],
                    info=ProcInfo(
                        p["executable"], p["command_line"], p["user"], None, parse_cgroup(p["cgroup"])
                    ),
                )
                for p in g["processes"]
            ],
        )
        for g in busy
    ]
    messages = process_messages(observed, ProcessRules.load(), source="mock", collector_id="c", hostname="h")
    for m in messages:
        (p,) = m.processes
        assert p.classification == ProcessClass.TRAINING
        assert p.rule == "distributed-worker"
        assert p.pod_uid is not None
        assert p.container_id is not None
        assert p.qos_class is not None

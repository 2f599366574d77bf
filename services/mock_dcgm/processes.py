"""The processes the mock fleet's GPUs run, consistent with their simulated jobs, for `GET /processes`.

A GPU with a job runs one PyTorch worker of that job, launched by torchrun
(the mock's pods are training workers): its memory is the GPU's used memory
less the driver's context, its SM and memory utilisation follow the load, and
its cgroup path is the kubepods (v2, systemd driver) path a kubelet would give
it, so the pod UID and container id come out of it as on a real node. An idle
GPU runs nothing. The body is what a collector needs to classify them.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from .clock import iso
from .fleet import Fleet
from .simulation import GpuSim

_CONTEXT_MIB = 512  # what the CUDA context itself holds, outside the process's own allocations
_QOS = ("burstable", "besteffort", "guaranteed")


def _process(gpu: GpuSim, started: float, now: float) -> dict[str, Any] | None:
    job = gpu.job
    if job is None:
        return None
    values = gpu.values()
    used = values.get("fb_used_mib")
    digest = hashlib.sha256(f"{gpu.uuid}/{job.namespace}/{job.pod}".encode()).hexdigest()
    pod_uid = str(uuid.UUID(digest[:32], version=4))
    qos = _QOS[int(digest[32], 16) % 3]
    pod_slice = f"kubepods-{qos}-pod{pod_uid.replace('-', '_')}.slice"
    parent = "kubepods.slice" if qos == "guaranteed" else f"kubepods.slice/kubepods-{qos}.slice"
    if qos == "guaranteed":
        pod_slice = f"kubepods-pod{pod_uid.replace('-', '_')}.slice"
    util = values.get("gpu_util_pct")
    return {
        "pid": 1000 + int(digest[:6], 16) % 4_000_000,
        "type": "compute",
        "used_memory_mib": max(int(used) - _CONTEXT_MIB, 0) if isinstance(used, int | float) else None,
        "sm_util_pct": float(util) if isinstance(util, int | float) else None,
        "mem_util_pct": float(values["mem_copy_util_pct"] or 0),
        "executable": "/usr/bin/python3.11",
        "command_line": (
            f"/usr/bin/python3.11 -u train.py --local-rank={gpu.index} --nproc-per-node=8"
            f" --config /etc/{job.container}/{job.pod.rsplit('-worker', 1)[0]}.yaml"
        ),
        "user": "mluser",
        "start_time": iso(min(started, now)),
        "cgroup": f"0::/{parent}/{pod_slice}/cri-containerd-{digest[:64]}.scope",
    }


class MockProcesses:
    """Remembers when each simulated job first ran, as its process start time."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._started: dict[tuple[str, str], float] = {}

    def node(self, index: int) -> dict[str, Any]:
        node = self.fleet.nodes[index]
        with node.lock:
            now = self.fleet.clock.now()
            node.advance(now)
            gpus = []
            for gpu in node.gpus:
                procs = []
                if gpu.job is not None and gpu.present:
                    started = self._started.setdefault((gpu.uuid, gpu.job.pod), now)
                    if (p := _process(gpu, started, now)) is not None:
                        procs.append(p)
                gpus.append({"gpu_uuid": gpu.uuid, "gpu_index": gpu.index, "processes": procs})
        return {"hostname": node.hostname, "time": iso(now), "gpus": gpus}

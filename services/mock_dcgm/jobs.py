"""A job's crash across its GPUs: one job on several GPUs, then the same application XID on each.

A `job_crash` request (POST /faults, a scenario's faults) names its first GPU like any fault
(`node` and `gpu`, or `gpu_uuid`) and takes these params:

- `gpus` (default 8): how many GPUs the job runs on, from the first one on in index order,
  on to the next node's GPU 0 where a node has no more;
- `code` (default 13): the application XID every worker's GPU logs when the job dies;
- `spread_s` (default 5): the XIDs come within these seconds of the first, one per GPU in
  order (a collective's peers die within seconds of each other);
- `ran_s` (default 1800): how long the job ran before it crashed;
- `job` (default 0): 0 is a job of its own (`ddp-crash-NNNN`); k > 0 names job `ddp-job-k`,
  so the crashes of one job restarted again and again (a crash loop) carry one name.

Each GPU of the job shows the job's workers in its labels (pod `<job>-worker-<k>` in
namespace `ml-training`, which the scorer reads as job `<job>`) from `ran_s` before the
crash until its XID clears (`duration_s`, default 300). The XIDs are ordinary `xid` faults
marked with the crash's id; the ground truth lists each crash with its job, GPUs and hosts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .faults import Fault, FaultError, FaultKind, make_fault
from .simulation import Job

if TYPE_CHECKING:
    from .fleet import Fleet

KIND = "job_crash"
PARAMS: dict[str, float] = {"gpus": 8.0, "code": 13.0, "spread_s": 5.0, "ran_s": 1800.0, "job": 0.0}
_LIMITS = {
    "gpus": (2, 4096),
    "code": (1, 999),
    "spread_s": (0, 3600),
    "ran_s": (0, 30 * 86400),
    "job": (0, 999_999),
}
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class JobCrash:
    id: int
    job: str  # namespace/name, as the scorer names the job
    code: int
    start_s: float  # the first XID
    faults: tuple[Fault, ...]  # one per GPU, in rank order


def _params(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise FaultError("params must be an object")
    merged = dict(PARAMS)
    for name, value in raw.items():
        if name not in PARAMS:
            raise FaultError(f"{KIND} takes no parameter {name!r}; it takes: {', '.join(PARAMS)}")
        low, high = _LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise FaultError(f"{KIND} parameter {name} must be a number in {low}..{high}, got {value!r}")
        merged[name] = float(value)
    if any(merged[k] != int(merged[k]) for k in ("gpus", "code", "job")):
        raise FaultError(f"{KIND} parameters gpus, code and job are whole numbers")
    return merged


def inject_job_crash(
    fleet: Fleet, request: dict[str, Any], *, node: int, gpu: int, start_s: float
) -> JobCrash:
    """Put one job on the GPUs from (node, gpu) on, and crash it at start_s (see the module docstring)."""
    p = _params(request.get("params") or {})
    duration = request.get("duration_s", 300.0)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not 0 < duration <= 365 * 86400:
        raise FaultError("duration_s must be a number above 0 and at most a year")
    n, per_node = int(p["gpus"]), fleet.spec.gpus_per_node
    first = node * per_node + gpu
    if first + n > len(fleet.nodes) * per_node:
        raise FaultError(f"a {n}-GPU job from node {node} GPU {gpu} needs more GPUs than the fleet has")
    crash_id = next(_ids)
    name = f"ddp-job-{int(p['job'])}" if p["job"] else f"ddp-crash-{crash_id:04d}"
    faults = []
    for k in range(n):
        target = fleet.nodes[(first + k) // per_node].gpus[(first + k) % per_node]
        at = start_s + (p["spread_s"] * k / (n - 1))
        fault = make_fault(
            kind=FaultKind.XID.value,
            node=target.node,
            gpu=target.index,
            start_s=at,
            model=target.model,
            duration_s=float(duration),
            params={"code": p["code"]},
        )
        fault.job_crash = crash_id
        worker = Job(
            pod=f"{name}-worker-{k}",
            namespace="ml-training",
            container="trainer",
            level=0.9,
            memory_fraction=0.8,
        )
        target.shared_jobs.append((start_s - p["ran_s"], at + float(duration), worker))
        faults.append(fault)
    return JobCrash(crash_id, f"ml-training/{name}", int(p["code"]), start_s, tuple(faults))

"""The fleet: nodes of simulated GPUs, a simulated clock, injected faults and their ground truth."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .clock import SimClock, iso
from .exposition import render_node
from .faults import SUBSYSTEM, Fault, FaultError, FaultKind, NotFoundError, RemedyRefusedError, make_fault
from .jobs import KIND as JOB_CRASH
from .jobs import JobCrash, inject_job_crash
from .kernel_log import NodeLog, check_xid_params
from .profiles import MODELS
from .remedies import Remedy, check_host, end_faults, off_the_bus, parse_remedy, remedy_record, reset_state
from .simulation import GpuSim, build_node

# What fails the mock's compute check (the remediator's validation, #34): an active fault that is a
# failure in itself (a DBE, a failed remap, a fall off the bus, a critical XID), any active fault but a
# healthy condition, or nothing (the check always passes).
ComputeCheck = Literal["hard_failure", "any_fault", "nothing"]


def _fails(fault: Fault, fails_on: ComputeCheck) -> bool:
    if fails_on == "hard_failure":
        return fault.hard_failure
    return fails_on == "any_fault" and fault.kind is not FaultKind.HEAVY_WORKLOAD


def _is_bool(*values: Any) -> bool:
    return any(isinstance(v, bool) for v in values)


DEFAULT_MODELS = ("h100-sxm", "h100-sxm", "a100-sxm4-80gb", "v100-sxm2-32gb")


@dataclass(frozen=True, slots=True)
class FleetSpec:
    nodes: int = 4
    gpus_per_node: int = 8
    models: tuple[str, ...] = DEFAULT_MODELS
    seed: int = 42
    hostname_prefix: str = "gpu-node-"
    driver_version: str = "550.90.07"
    workload_labels: bool = True


def failure_times(faults: list[Fault], uuid_of: Callable[[Fault], str]) -> dict[str, dict[str, Any]]:
    """Per GPU: when it really fails (its first hard failure) and when its first precursor began."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(faults, key=lambda f: f.start_s):
        uuid = uuid_of(f)
        if f.hard_failure and uuid not in out:  # the first hard failure is the failure
            out[uuid] = {
                "failure": iso(f.start_s),
                "failure_ms": int(f.start_s * 1000),
                "failure_kind": f.kind.value,
                "precursor_start_ms": None,
            }
    for f in sorted(faults, key=lambda f: f.start_s):
        entry = out.get(uuid_of(f))
        if (
            entry
            and f.precursor
            and entry["precursor_start_ms"] is None
            and f.start_s * 1000 < entry["failure_ms"]
        ):
            entry["precursor_start_ms"] = int(f.start_s * 1000)
    return out


class Fleet:
    """All nodes, thread-safe: each node is advanced and rendered under its own lock."""

    def __init__(self, spec: FleetSpec, clock: SimClock) -> None:
        unknown = [m for m in spec.models if m not in MODELS]
        if unknown or not spec.models:
            raise FaultError(f"unknown GPU models {unknown}; known: {', '.join(MODELS)}")
        self.spec, self.clock = spec, clock
        self.nodes = [
            build_node(
                index=i,
                hostname=f"{spec.hostname_prefix}{i:02d}",
                model=MODELS[spec.models[i % len(spec.models)]],
                gpus=spec.gpus_per_node,
                seed=spec.seed,
                t0=clock.start_s,
            )
            for i in range(spec.nodes)
        ]
        self.kernel_logs = [NodeLog(node.hostname) for node in self.nodes]
        self._faults: list[Fault] = []
        self._job_crashes: list[JobCrash] = []
        self._repairs: list[dict[str, Any]] = []
        self._remedies: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- rendering
    def scrape(self, node_index: int, *, timestamps: bool) -> tuple[str, float]:
        """The node's exposition now, and the delay its scrape should suffer."""
        node = self.nodes[node_index]
        with node.lock:
            t = self.clock.now()
            delay = node.advance(t)
            text = render_node(
                node,
                driver_version=self.spec.driver_version,
                workload_labels=self.spec.workload_labels,
                timestamp_ms=int(t * 1000) if timestamps else None,
            )
        return text, delay

    def journal(self, node_index: int, *, after_cursor: str | None, since: str | None) -> tuple[bytes, int]:
        """The node's kernel log as `journalctl -k -o json` prints it (kernel_log.py), and the records
        the reader lost to the ring; FaultError for a cursor or time it cannot read."""
        node, log = self.nodes[node_index], self.kernel_logs[node_index]
        with node.lock:
            log.catch_up(node.gpus, self.clock.now(), self.spec.driver_version)
            records, lost = log.read(after_cursor=after_cursor, since=since)
        return log.journal(records), lost

    # ---------------------------------------------------------------- faults
    def gpu(self, node: int, gpu: int) -> GpuSim:
        if not 0 <= node < len(self.nodes):
            raise FaultError(f"node must be 0..{len(self.nodes) - 1}")
        if not 0 <= gpu < self.spec.gpus_per_node:
            raise FaultError(f"gpu must be 0..{self.spec.gpus_per_node - 1}")
        return self.nodes[node].gpus[gpu]

    def find(self, gpu_uuid: str) -> GpuSim:
        for node in self.nodes:
            for g in node.gpus:
                if g.uuid == gpu_uuid:
                    return g
        raise NotFoundError(f"no GPU with UUID {gpu_uuid!r} in this fleet")

    def named(self, request: dict[str, Any]) -> GpuSim:
        """The GPU a request names: by gpu_uuid, or by integer node and gpu."""
        if "gpu_uuid" in request:
            return self.find(str(request["gpu_uuid"]))
        node, gpu = request.get("node"), request.get("gpu")
        if not isinstance(node, int) or not isinstance(gpu, int) or _is_bool(node, gpu):
            raise FaultError("name the GPU with gpu_uuid, or with integer node and gpu")
        return self.gpu(node, gpu)

    def repair(self, request: Any) -> dict[str, Any]:
        """An operator's repair of one GPU now (`{"gpu_uuid": ...}` or node and gpu): every fault on it
        ends, and it is reset: its volatile ECC counts, last XID and pending row remap start again. Its
        aggregate counts, retired pages and remapped rows stay, as on a real GPU."""
        if not isinstance(request, dict) or set(request) - {"gpu_uuid", "node", "gpu"}:
            raise FaultError("a repair names one GPU: gpu_uuid, or node and gpu, and nothing else")
        target = self.named(request)
        node = self.nodes[target.node]
        with node.lock, self._lock:
            now = self.clock.now()
            node.advance(now)
            ended = [f.id for f in target.faults if f.start_s <= now and (f.end_s is None or f.end_s > now)]
            for fault in target.faults:
                if fault.id in ended:
                    fault.cleared_at_s, fault.ended_by = now, "repair"
                elif fault.start_s > now:
                    fault.cleared_at_s = fault.start_s  # scheduled after the repair: it never happens
            reset_state(target, now)
            repair = {
                "gpu_uuid": target.uuid,
                "node": target.node,
                "gpu": target.index,
                "hostname": node.hostname,
                "time": iso(now),
                "time_ms": int(now * 1000),
                "faults_ended": ended,
            }
            self._repairs.append(repair)
        return repair

    def remedy(self, remedy: Remedy, request: Any) -> dict[str, Any]:
        """A GPU reset (`reset_gpu`: the GPUs named) or a reboot (`reboot_node`: every GPU of the node
        named, or of the GPUs' node) now, as the remediator's exec driver asks by webhook (remedies.py):
        what it ended and left. NotFoundError for a GPU or node not here; RemedyRefusedError for a reset
        of a GPU off the bus (recorded in the ground truth all the same); FaultError for a bad request."""
        uuids, host, plan_id = parse_remedy(request, "reset_gpu" if remedy == "reset_gpu" else "reboot")
        gpus = [self.find(uuid) for uuid in uuids]
        hostnames = [n.hostname for n in self.nodes]
        check_host(gpus, hostnames, host)
        indexes = {g.node for g in gpus} if gpus else {hostnames.index(str(host))}
        if len(indexes) != 1:
            raise FaultError(f"a {remedy} names GPUs of one node")
        node = self.nodes[indexes.pop()]
        if remedy == "reset_gpu" and not gpus:
            raise FaultError("a GPU reset names gpu_uuid (comma-separated)")
        targets = gpus if remedy == "reset_gpu" else node.gpus
        with node.lock, self._lock:
            now = self.clock.now()
            node.advance(now)
            at = {"time": iso(now), "time_ms": int(now * 1000)}
            gone = [g.uuid for g in targets if off_the_bus(g, now)] if remedy == "reset_gpu" else []
            if gone:
                said = f"cannot reset {', '.join(gone)}: off the bus, nvidia-smi cannot reach it"
                left = [f for g in targets for f in g.faults if f.active(now)]
                refused = remedy_record(
                    remedy,
                    gpus=targets,
                    hostname=node.hostname,
                    plan_id=plan_id,
                    at=at,
                    ok=False,
                    said=said,
                    ended=[],
                    left=left,
                    recurrences=[],
                )
                self._remedies.append(refused)
                raise RemedyRefusedError(said)
            ended, left, recurrences = [], [], []
            for gpu in targets:
                gone_before = bool(off_the_bus(gpu, now))
                e, k, r = end_faults(gpu, now, remedy, self.spec.seed)
                ended += e
                left += k
                recurrences += r
                gpu.faults.extend(r)
                self._faults.extend(r)
                if not gone_before or not off_the_bus(gpu, now):
                    reset_state(gpu, now)
            said = f"{remedy}: {len(ended)} faults ended, {len(left)} left"
            record = remedy_record(
                remedy,
                gpus=targets,
                hostname=node.hostname,
                plan_id=plan_id,
                at=at,
                ok=True,
                said=said,
                ended=ended,
                left=left,
                recurrences=recurrences,
            )
            self._remedies.append(record)
        return record

    def inject(self, request: dict[str, Any]) -> Fault:
        """Add a fault from a request: kind, node+gpu or gpu_uuid, after_s, duration_s, params."""
        if not isinstance(request, dict):
            raise FaultError("a fault is a JSON object")
        allowed = {
            "kind",
            "node",
            "gpu",
            "gpu_uuid",
            "after_s",
            "duration_s",
            "params",
            "fixed_by",
            "recur_after_s",
            "recur_probability",
        }
        extra = set(request) - allowed
        if extra:
            raise FaultError(f"unknown fault fields {sorted(extra)}; allowed: {sorted(allowed)}")
        target = self.named(request)
        after = request.get("after_s")
        if after is None:
            start = self.clock.now()
        elif isinstance(after, int | float) and not isinstance(after, bool) and after >= 0:
            start = self.clock.start_s + float(after)
        else:
            raise FaultError("after_s is seconds after the simulation start, a number >= 0")
        duration = request.get("duration_s")
        if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int | float)):
            raise FaultError("duration_s must be a number")
        params = request.get("params") or {}
        if not isinstance(params, dict):
            raise FaultError("params must be an object")
        if request.get("kind") == JOB_CRASH:  # several GPUs at once: the first one's fault is returned
            return self._inject_job_crash(request, target, start)
        fault = make_fault(
            kind=str(request.get("kind")),
            node=target.node,
            gpu=target.index,
            start_s=start,
            model=target.model,
            duration_s=None if duration is None else float(duration),
            params=params,
            fixed_by=request.get("fixed_by"),
            recur_after_s=request.get("recur_after_s"),
            recur_probability=request.get("recur_probability"),
        )
        if fault.kind is FaultKind.XID:
            check_xid_params(fault.params)
        node_sim = self.nodes[target.node]
        with node_sim.lock, self._lock:
            target.faults.append(fault)
            self._faults.append(fault)
        return fault

    def _inject_job_crash(self, request: dict[str, Any], first: GpuSim, start: float) -> Fault:
        with contextlib.ExitStack() as held:  # the crash's GPUs span nodes: every node's lock, in order
            for node in self.nodes:
                held.enter_context(node.lock)
            held.enter_context(self._lock)
            crash = inject_job_crash(self, request, node=first.node, gpu=first.index, start_s=start)
            for fault in crash.faults:
                self.nodes[fault.node].gpus[fault.gpu].faults.append(fault)
            self._faults.extend(crash.faults)
            self._job_crashes.append(crash)
        return crash.faults[0]

    def clear(self, fault_id: int) -> Fault:
        """End a fault now (a GPU back on the bus, a fan fixed); its counters keep their values."""
        with self._lock:
            for fault in self._faults:
                if fault.id == fault_id:
                    if fault.end_s is None or fault.end_s > self.clock.now():
                        fault.cleared_at_s = max(self.clock.now(), fault.start_s)
                        fault.ended_by = "cleared"
                    return fault
        raise NotFoundError(f"no fault with id {fault_id}")

    def load_scenario(self, path: Path) -> list[Fault]:
        try:
            scenario = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise FaultError(f"scenario {path}: {e}") from e
        faults = scenario.get("faults") if isinstance(scenario, dict) else None
        if not isinstance(faults, list):
            raise FaultError(f"scenario {path}: expected an object with a 'faults' list")
        injected = []
        for i, request in enumerate(faults):
            try:
                injected.append(self.inject(request))
            except FaultError as e:
                raise FaultError(f"scenario {path}, fault #{i}: {e}") from e
        return injected

    # ---------------------------------------------------------------- compute check
    def compute_check(self, gpu_uuids: list[str], fails_on: ComputeCheck) -> dict[str, Any]:
        """The compute check on each GPU, as the remediator's exec driver asks a node for it: a GPU fails
        while a fault `fails_on` counts is active on it (until a remedy that fixes it, a repair, its
        duration or DELETE /faults/<id> ends it). NotFoundError for a GPU not in this fleet."""
        gpus = [self.find(uuid) for uuid in gpu_uuids]
        now = self.clock.now()
        with self._lock:
            faults = list(self._faults)
        results = []
        for gpu in gpus:
            failing = [
                f
                for f in faults
                if (f.node, f.gpu) == (gpu.node, gpu.index) and f.active(now) and _fails(f, fails_on)
            ]
            results.append(
                {
                    "gpu_uuid": gpu.uuid,
                    "hostname": self.nodes[gpu.node].hostname,
                    "passed": not failing,
                    "faults": [{"id": f.id, "kind": f.kind.value} for f in failing],
                }
            )
        return {"passed": all(r["passed"] for r in results), "fails_on": fails_on, "gpus": results}

    # ---------------------------------------------------------------- truth
    def ground_truth(self) -> dict[str, Any]:
        now = self.clock.now()
        with self._lock:
            faults, crashes, repairs = list(self._faults), list(self._job_crashes), list(self._repairs)
            remedies = list(self._remedies)
        return {
            "sim_time": iso(now),
            "sim_time_ms": int(now * 1000),
            "speed": self.clock.speed,
            "faults": [self.describe(f, now) for f in faults],
            "job_crashes": [self.describe_job_crash(c) for c in crashes],
            "repairs": repairs,
            "remedies": remedies,
            "failures": failure_times(faults, lambda f: self.nodes[f.node].gpus[f.gpu].uuid),
        }

    def describe(self, fault: Fault, now: float | None = None) -> dict[str, Any]:
        now = self.clock.now() if now is None else now
        gpu = self.nodes[fault.node].gpus[fault.gpu]
        end = fault.end_s
        return {
            "id": fault.id,
            "kind": fault.kind.value,
            "subsystem": SUBSYSTEM[fault.kind],
            "gpu_uuid": gpu.uuid,
            "node": fault.node,
            "gpu": fault.gpu,
            "hostname": self.nodes[fault.node].hostname,
            "model": gpu.model.name,
            "start": iso(fault.start_s),
            "start_ms": int(fault.start_s * 1000),
            "end": iso(end) if end is not None else None,
            "end_ms": int(end * 1000) if end is not None else None,
            "active": fault.active(now),
            "hard_failure": fault.hard_failure,
            "precursor": fault.precursor,
            "params": fault.params,
            "job_crash": fault.job_crash,
            "fixed_by": fault.fixed_by,
            "ended_by": fault.ended_by,
            "recur_after_s": fault.recur_after_s,
            "recur_probability": fault.recur_probability,
            "recurrence_of": fault.recurrence_of,
        }

    def describe_job_crash(self, crash: JobCrash) -> dict[str, Any]:
        gpus = [self.nodes[f.node].gpus[f.gpu] for f in crash.faults]
        return {
            "id": crash.id,
            "job": crash.job,
            "code": crash.code,
            "start_ms": int(crash.start_s * 1000),
            "last_ms": int(max(f.start_s for f in crash.faults) * 1000),
            "gpus": [g.uuid for g in gpus],
            "hosts": sorted({self.nodes[g.node].hostname for g in gpus}),
        }

    def inventory(self, url_for: Callable[[int], str]) -> list[dict[str, Any]]:
        return [
            {
                "node": node.index,
                "hostname": node.hostname,
                "metrics_url": url_for(node.index),
                "gpus": [
                    {
                        "gpu": g.index,
                        "uuid": g.uuid,
                        "model": g.model.name,
                        "pci_bus_id": g.pci_bus_id,
                    }
                    for g in node.gpus
                ],
            }
            for node in self.nodes
        ]

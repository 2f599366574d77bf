"""What a remedy does to the simulated GPUs: a GPU reset, a reboot of the node, and whether each ends a fault.

The remediator's exec driver calls a reset (``POST /reset-gpu``) and a reboot
(``POST /reboot``) as webhooks, as it calls the compute check. Each fault has
the least remedy that ends it (`Fault.fixed_by`, the kind's default in
faults.py, or the request's `fixed_by`): a reset ends what a reset fixes; a
reboot resets every GPU of the node and ends what a reset or a reboot fixes;
the rest (a failed row remap, a degrading part) stays until a repair. A reset
of a GPU that has fallen off the bus cannot run (nvidia-smi cannot reach it): it
is refused, as a real one fails. Every reset also clears the GPU's volatile ECC
counts, its last XID and a pending row remap (the remap is applied), whatever
it ended.

A flaky fault (`recur_after_s` with `recur_probability`) comes back after a
remedy ends it: with that probability, the same fault again `recur_after_s`
later, itself as flaky. The draw is seeded by the fleet's seed, the GPU and the
fault's start, so a run is repeated exactly. A repair ends every fault and
every recurrence still to come.

The ground truth lists every remedy asked for (`remedies`): what it was, on
which GPUs, for which plan, when, whether it ran, and its true effect: the
faults it ended, those it left, and the recurrences it drew.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from .faults import Fault, FaultError, FaultKind, NotFoundError, next_fault_id

if TYPE_CHECKING:
    from .simulation import GpuSim

Remedy = Literal["reset_gpu", "reboot_node"]
ENDS: dict[str, frozenset[str]] = {  # a remedy ends the faults whose fixed_by is one of these
    "reset_gpu": frozenset({"reset_gpu"}),
    "reboot_node": frozenset({"reset_gpu", "reboot_node"}),
    "repair": frozenset({"reset_gpu", "reboot_node", "repair"}),
}
VOLATILE = ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total")
# What the remediator's webhook sends (services/remediator/drivers/node_exec.py); nothing else is taken.
WEBHOOK_FIELDS = frozenset({"operation", "node", "gpu_uuid", "gpu_index", "plan_id"})
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{1,64}$")
_HOST = re.compile(r"^[A-Za-z0-9._-]{1,253}$")


def parse_remedy(request: Any, operation: str) -> tuple[list[str], str | None, int | None]:
    """A webhook's body: (GPU UUIDs, node hostname or None, plan id or None); FaultError when malformed."""
    if not isinstance(request, dict):
        raise FaultError(f"a {operation} request is a JSON object naming gpu_uuid and/or node")
    extra = set(request) - WEBHOOK_FIELDS
    if extra:
        raise FaultError(f"unknown fields {sorted(map(str, extra))}; allowed: {sorted(WEBHOOK_FIELDS)}")
    if request.get("operation", operation) != operation:
        raise FaultError(f"operation must be {operation!r} here")
    uuids_text, node, plan = request.get("gpu_uuid"), request.get("node"), request.get("plan_id")
    uuids: list[str] = []
    if uuids_text is not None:
        if not isinstance(uuids_text, str) or not uuids_text:
            raise FaultError("gpu_uuid is one GPU UUID, or several separated by commas")
        uuids = uuids_text.split(",")
        if len(uuids) > 64 or not all(_UUID.match(u) for u in uuids):
            raise FaultError("gpu_uuid is one GPU UUID, or up to 64 separated by commas")
    if node is not None and (not isinstance(node, str) or not _HOST.match(node)):
        raise FaultError("node is a host name")
    if isinstance(plan, str) and plan.isascii() and plan.isdigit() and len(plan) <= 18:
        plan = int(plan)
    if plan is not None and (isinstance(plan, bool) or not isinstance(plan, int) or plan < 0):
        raise FaultError("plan_id is a whole number")
    if not uuids and node is None:
        raise FaultError(f"a {operation} names gpu_uuid (comma-separated) or node")
    return uuids, node, plan


def check_host(gpus: list[GpuSim], hostnames: list[str], node: str | None) -> None:
    """NotFoundError when `node` is given and is not the host of every GPU named."""
    if node is None:
        return
    if node not in hostnames:
        raise NotFoundError(f"no node {node!r} in this fleet")
    wrong = [g.uuid for g in gpus if hostnames[g.node] != node]
    if wrong:
        raise NotFoundError(f"GPUs {wrong[:4]} are not on {node}")


def off_the_bus(gpu: GpuSim, now: float) -> list[Fault]:
    return [f for f in gpu.faults if f.kind is FaultKind.FALL_OFF_BUS and f.active(now)]


def reset_state(gpu: GpuSim, now: float) -> None:
    """What any reset does to the GPU (advanced to `now` first): its volatile ECC counts start again, and
    what came before is no longer its last XID or a pending remap (simulation.py)."""
    shown = gpu.values()
    for name in VOLATILE:
        gpu.volatile_at_reset[name] = gpu.volatile_at_reset.get(name, 0.0) + float(shown[name] or 0)
    gpu.reset_s = now


def end_faults(
    gpu: GpuSim, now: float, remedy: str, seed: int
) -> tuple[list[Fault], list[Fault], list[Fault]]:
    """The GPU's active faults `remedy` ends (now), those it leaves, and the recurrences it drew."""
    ended, left, recurrences = [], [], []
    for fault in list(gpu.faults):
        if not fault.active(now):
            continue
        if fault.fixed_by not in ENDS[remedy]:
            left.append(fault)
            continue
        fault.cleared_at_s, fault.ended_by = now, remedy
        ended.append(fault)
        if fault.recur_after_s is not None and fault.recur_probability > 0:
            draw = random.Random(f"{seed}:{gpu.node}:{gpu.index}:{fault.start_s!r}:recur")  # noqa: S311
            if draw.random() < fault.recur_probability:
                recurrences.append(
                    replace(
                        fault,
                        start_s=now + fault.recur_after_s,
                        cleared_at_s=None,
                        ended_by=None,
                        recurrence_of=fault.id,
                        id=next_fault_id(),
                    )
                )
    return ended, left, recurrences


def remedy_record(
    remedy: str,
    *,
    gpus: list[GpuSim],
    hostname: str,
    plan_id: int | None,
    at: dict[str, Any],
    ok: bool,
    said: str,
    ended: list[Fault],
    left: list[Fault],
    recurrences: list[Fault],
) -> dict[str, Any]:
    """The ground truth's record of one remedy: what, where, when, and its true effect."""
    return {
        "remedy": remedy,
        "ok": ok,
        "said": said,
        "gpu_uuids": [g.uuid for g in gpus],
        "node": gpus[0].node if gpus else None,
        "hostname": hostname,
        "plan_id": plan_id,
        **at,
        "faults_ended": [f.id for f in ended],
        "faults_left": [f.id for f in left],
        "recurrences": [
            {"fault": f.id, "of": f.recurrence_of, "start_ms": int(f.start_s * 1000)} for f in recurrences
        ],
    }

"""Whether a node may return to service: its GPUs seen again as themselves, the compute check, healthy cycles.

One look at a time, each from the state the previous look left in the plan's
detail (so a restart goes on where it was):

1. identity: every GPU the node had when the plan opened has a sample newer
   than the one it had before the reset or reboot, and no other GPU turned up
   on the node (a different UUID is a different GPU: not the same identity);
2. the compute check, once, through the exec driver, on each GPU;
3. `healthy_cycles` scoring cycles in a row (gpu_status.as_of moving on for
   every GPU, past the remedy) in which every GPU is healthy; a degraded cycle
   resets the count. After a remedy (a reset, a reboot, a repair) the scorer
   counts nothing the remedy resolved from before it, so a GPU unhealthy in a
   cycle after it has the fault again: a recurrence fails the validation at once.

Past the policy's timeout the validation fails, and the node stays out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from shared.store import remediation as store
from shared.store.remediation import SyncConn

from .drivers.base import DriverResult
from .drivers.node_exec import NodeExec
from .policy import Validation

Verdict = Literal["passed", "failed", "waiting"]


@dataclass(frozen=True, slots=True)
class Look:
    verdict: Verdict
    reason: str
    state: dict[str, Any]  # what the next look starts from
    compute: DriverResult | None = None  # the compute check, when this look ran it


def baseline(conn: SyncConn, node: str) -> dict[str, str]:
    """The node's GPUs and their newest sample's time, before a reset or reboot (or the validation)."""
    return {uuid: iso(at) for uuid, at in store.last_seen(conn, node).items()}


def iso(at: datetime) -> str:
    """A time as the plan's detail keeps it (ISO 8601, UTC: compared as text)."""
    return at.astimezone(UTC).isoformat()


def look(
    conn: SyncConn,
    *,
    node: str,
    plan_id: int,
    identity: dict[str, int],
    state: dict[str, Any],
    rules: Validation,
    node_exec: NodeExec,
    timed_out: bool,
) -> Look:
    """One look at the validation, from `state` (empty at the first look)."""
    state = dict(state)
    if not state.get("identity_ok"):
        seen = baseline(conn, node)
        if "seen_before" not in state:  # no reset or reboot took one: samples from now on count
            state["seen_before"] = seen
            return _waiting_or_failed(timed_out, "waiting for the GPUs' next samples", state)
        before = state["seen_before"]
        strangers = sorted(set(seen) - set(identity))
        if strangers:
            return Look("failed", f"GPUs that were not on the node before: {strangers[:8]}", state)
        missing = sorted(u for u in identity if u not in seen or seen[u] <= before.get(u, ""))
        if missing:
            return _waiting_or_failed(timed_out, f"GPUs not seen again yet: {missing[:8]}", state)
        state["identity_ok"] = True
    compute = None
    if rules.compute_check and not state.get("compute_ok"):
        compute = node_exec.run("compute_check", node=node, gpus=identity, plan_id=plan_id)
        if compute.status != "ok":
            return Look("failed", compute.reason or "the compute check failed", state, compute)
        state["compute_ok"] = True
    counted = _cycles(conn, identity, state)
    if counted is not None and state.get("remedied_at"):
        unhealthy = sorted(u for u, s in counted.items() if s == "unhealthy")
        if unhealthy:  # the remedy resolved what came before: this came after it
            return Look(
                "failed", f"recurred after the remedy: {unhealthy[:8]} unhealthy again", state, compute
            )
    if counted is not None:
        healthy = all(s == "healthy" for s in counted.values())
        state["healthy_cycles"] = state.get("healthy_cycles", 0) + 1 if healthy else 0
    cycles = int(state.get("healthy_cycles", 0))
    if cycles >= rules.healthy_cycles:
        return Look(
            "passed", f"same GPUs seen again, compute check passed, {cycles} healthy cycles", state, compute
        )
    return _waiting_or_failed(timed_out, f"{cycles} of {rules.healthy_cycles} healthy cycles", state, compute)


def _cycles(conn: SyncConn, identity: dict[str, int], state: dict[str, Any]) -> dict[str, str] | None:
    """Each GPU's state when a new scoring cycle judged every GPU of `identity` since the last one counted
    (and after the remedy, when there was one); None when no new cycle has. The first look's cycle is
    the one before: it may have read what the remedy had not yet resolved."""
    found = store.statuses(conn, list(identity))
    as_of = {uuid: iso(at) for uuid, _, at in found}
    if set(as_of) != set(identity):
        return None
    counted = state.get("counted_as_of") or as_of
    after = str(state.get("remedied_at") or "")
    if not all(as_of[u] > counted.get(u, "") and as_of[u] > after for u in identity):
        state["counted_as_of"] = counted
        return None
    state["counted_as_of"] = as_of
    return {uuid: status for uuid, status, _ in found}


def assume(
    conn: SyncConn,
    *,
    identity: dict[str, int],
    state: dict[str, Any],
    rules: Validation,
    returns: bool,
    timed_out: bool,
) -> Look:
    """A dry run's validation: nothing was done, so nothing can be judged; it lasts as long as the live
    one would need at least (`healthy_cycles` scoring cycles after the step began) and then passes
    where the plan would return the node, fails where it would keep it out."""
    state = dict(state)
    if _cycles(conn, identity, state) is not None:
        state["cycles"] = int(state.get("cycles", 0)) + 1
    cycles = int(state.get("cycles", 0))
    if cycles < rules.healthy_cycles:
        return _waiting_or_failed(timed_out, f"{cycles} of {rules.healthy_cycles} cycles", state)
    if returns:
        return Look("passed", f"assumed to pass after {cycles} cycles: the policy returns the node", state)
    return Look("failed", f"assumed to fail after {cycles} cycles: the policy keeps the node out", state)


def _waiting_or_failed(
    timed_out: bool, reason: str, state: dict[str, Any], compute: DriverResult | None = None
) -> Look:
    if timed_out:
        return Look("failed", f"validation timed out: {reason}", state, compute)
    return Look("waiting", reason, state, compute)

"""A held plan that never acted, whose GPUs are all healthy again, is withdrawn: nothing is left to do.

A held plan (waiting for an approval, the breaker, a limit) takes in its node's later findings. When
what it answers resolves by itself before anyone acts on it (a GPU back on the bus, a transient the
scorer no longer judges unhealthy), it would wait for a person all the same, and hold the node's next
real finding with it. So a healthy verdict for one of its GPUs withdraws it, with the reason on the
record, once every GPU of it is healthy. Only a plan that did nothing goes: one that escalated from
another plan, or on a node this mode holds out, stays for its validation and return (repairs.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.store import remediation as store
from shared.store import remediation_ledger as ledger
from shared.store.remediation import SyncConn

from .findings import Finding
from .record import event


def withdraw_if_moot(
    conn: SyncConn, finding: Finding, *, dry_run: bool, now: datetime
) -> list[dict[str, Any]]:
    """In the caller's transaction: withdraw the held plan of `finding`'s node when it never acted and
    each of its GPUs is healthy; the records written (none when the plan stays)."""
    plan = store.active_plan(conn, finding.hostname, dry_run)
    if plan is None or plan["state"] != "held" or plan["escalated_from"] is not None:
        return []
    gpus = sorted(plan["gpu_uuids"])
    if finding.gpu_uuid not in gpus or store.holds_node(conn, str(plan["node"]), dry_run):
        return []
    states = store.statuses(conn, gpus)
    if [u for u, _, _ in states] != gpus or any(state != "healthy" for _, state, _ in states):
        return []
    store.withdraw(conn, int(plan["id"]), now)
    record = event(
        "outcome",
        at=now,
        status="withdrawn",
        dry_run=dry_run,
        plan=plan,
        reason=f"moot before it acted: {', '.join(gpus)} healthy again (held for {plan['held_for']})",
        seconds=0.0,
    )
    ledger.insert_events(conn, [record])
    return [record]

"""The circuit breaker: at most N nodes, or P % of the fleet, taken out (cordoned or drained) within W;
and the cap beside it: at most M nodes, or Q % of the fleet, held out by the remediator at once.

`judge` is the rule, on plain values, so it can be checked against any
sequence of events; `admit_node` applies it to the state in the database, under
the lock of the mode's control row, so the remediators of one consumer group
share one breaker and a restart finds it as it was. A node already taken out
within the window counts once (a second step on it is no new node). Past the
bound the breaker opens: nothing more is admitted until an operator resets it,
and the node that tripped it is not taken out. At the cap the node waits (its plan
held for `nodes_out`) without tripping anything: the cap bounds how far the
remediator can go however slowly it goes, where the breaker bounds how fast.
"""

from __future__ import annotations

from collections.abc import Set
from datetime import datetime, timedelta
from typing import Literal

from shared.store import remediation_ledger as ledger
from shared.store.remediation import SyncConn

from .policy import Breaker, NodesOut

Answer = Literal["admit", "trip", "refuse", "cap"]


def judge(*, is_open: bool, in_window: Set[str], node: str, bound: int) -> Answer:
    """Whether `node` may be taken out, given the nodes taken out within the window and the bound.

    refuse: the breaker is open. trip: taking out `node` would make more than `bound` nodes.
    """
    if is_open:
        return "refuse"
    if node in in_window or len(in_window) < bound:
        return "admit"
    return "trip"


def within_cap(*, held_out: Set[str], node: str, cap: int) -> bool:
    """Whether `node` may be out, given the nodes the remediator holds out now (one of them may stay)."""
    return node in held_out or len(held_out) < cap


def admit_node(
    conn: SyncConn,
    *,
    node: str,
    dry_run: bool,
    plan_id: int,
    policy: Breaker,
    cap: NodesOut,
    now: datetime,
) -> tuple[Answer, str]:
    """Apply the cap and the breaker to taking out `node`, in the caller's transaction: (answer, why)."""
    control = ledger.control(conn, dry_run, lock=True)
    if control["breaker"] == "open":
        return "refuse", f"the breaker is open since {control['tripped_at']:%Y-%m-%d %H:%M:%S} UTC"
    fleet = ledger.fleet_nodes(conn)
    held_out, most = ledger.nodes_held_out(conn, dry_run), cap.bound(fleet)
    if not within_cap(held_out=held_out, node=node, cap=most):
        return "cap", (
            f"{len(held_out)} nodes held out by the remediator: the cap is {most}"
            f" (at most {cap.max_nodes} nodes or {cap.max_fleet_percent:g} % of {fleet})"
        )
    in_window = ledger.breaker_window(conn, dry_run, now - timedelta(seconds=policy.window_s))
    bound = policy.bound(fleet)
    answer = judge(is_open=False, in_window=in_window, node=node, bound=bound)
    if answer == "trip":
        why = (
            f"{len(in_window)} nodes taken out within {policy.window_s} s: the bound is {bound}"
            f" (at most {policy.max_nodes} nodes or {policy.max_fleet_percent:g} % of {fleet})"
        )
        ledger.trip(conn, dry_run=dry_run, reason=why, at=now)
        return "trip", why
    if node not in in_window:
        ledger.admit(conn, node=node, dry_run=dry_run, plan_id=plan_id, at=now)
    return "admit", f"{len(in_window | {node})} of {bound} nodes within {policy.window_s} s"

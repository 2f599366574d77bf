"""What the remediator does about one finding: nothing, join the node's plan, or open one (running or held).

All of it in the caller's transaction, with the record of it, so the decision,
its plan and its record are written together or not at all. A finding whose
decision exists (a redelivered message, a restart) is answered with nothing:
its plan already runs. A finding that needs more than the node's plan, a reset or
a reboot not yet carried out, can give escalates that plan at once (the plan it
opens is one rung up, as a failed validation's would be). A plan is held for an operator when the policy wants
approval for its action, when the breaker is open, when the node's last plan
left it out for a person (failed, escalated to nobody, or kept out) and no GPU
of it was marked repaired or returned since, when the node has had its
share of plans within the rate limit's window, or when the action's class has
had its share fleet-wide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.contract.models_health import LADDER
from shared.store import remediation as store
from shared.store import remediation_ledger as ledger
from shared.store.remediation import SyncConn
from shared.store.results import Row

from .findings import Finding, NodeMap, valid_node
from .policy import Policy
from .record import event

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Decided:
    outcome: str  # act, held, ignored, joined, unmapped; "" when the finding needs no decision
    plan_id: int | None = None
    reason: str | None = None
    events: tuple[dict[str, Any], ...] = ()


def hold_reason(
    conn: SyncConn,
    *,
    policy: Policy,
    action: str,
    node: str,
    dry_run: bool,
    now: datetime,
    limits: bool = True,
    approval: bool = True,
) -> tuple[str | None, str | None]:
    """Why a new plan of `action` on `node` must wait for an operator: (held_for, reason), or (None, None).
    `approval` False: whatever else would hold it, beside the policy's wanting an operator's approval."""
    rules = policy.for_action(action)
    if approval and rules.mode == "approval":
        return "approval", f"the policy wants an operator's approval for {action}"
    if ledger.control(conn, dry_run)["breaker"] == "open":
        return "breaker", "the breaker is open"
    if not limits:
        return None, None
    if (left := store.left_out_for_a_person(conn, node, dry_run)) is not None:
        return "approval", (
            f"plan {left['id']} ({left['action']}, {left['state']}) left {node} out for a person;"
            " an operator approves this one, or marks its GPU repaired or returned"
        )
    rate = policy.rate_limit
    started = store.plans_since(
        conn, dry_run=dry_run, since=now - timedelta(seconds=rate.window_s), node=node
    )
    if started >= rate.per_node:
        return "rate_limit", f"{started} plans on {node} within {rate.window_s} s (at most {rate.per_node})"
    if rules.max_per_window is not None:
        since = now - timedelta(seconds=rules.window_s)
        started = store.plans_since(conn, dry_run=dry_run, since=since, action=action)
        if started >= rules.max_per_window:
            return (
                "class_limit",
                f"{started} {action} plans within {rules.window_s} s (at most {rules.max_per_window})",
            )
    return None, None


def open_plan(
    conn: SyncConn,
    *,
    policy: Policy,
    node: str,
    gpu_uuids: list[str],
    action: str,
    finding: str,
    decision_key: str,
    answers: dict[str, Any],
    dry_run: bool,
    now: datetime,
    escalated_from: int | None = None,
) -> tuple[int, str | None, str | None]:
    """A new plan for the node: (id, held_for, reason). The GPUs the node has now are kept as its identity."""
    held_for, reason = hold_reason(
        conn, policy=policy, action=action, node=node, dry_run=dry_run, now=now, limits=escalated_from is None
    )
    detail = {"answers": answers, "identity": store.host_gpus(conn, node)}
    plan_id = store.create_plan(
        conn,
        node=node,
        gpu_uuids=gpu_uuids,
        action=action,
        finding=finding,
        steps=policy.for_action(action).steps,
        state="held" if held_for else "running",
        held_for=held_for,
        dry_run=dry_run,
        decision_key=decision_key,
        at=now,
        detail=detail,
        escalated_from=escalated_from,
    )
    return plan_id, held_for, reason


REMEDY_STEPS = ("reset_gpu", "reboot")


def start_held(
    conn: SyncConn, plan: Row, finding: Finding, *, policy: Policy, node: str, dry_run: bool, now: datetime
) -> str | None:
    """A plan held for approval of an action that starts without it when joined (`ActionPolicy.
    starts_when_joined`) starts when `finding`, on another of the node's GPUs, which the policy acts on by
    itself with a drain, joins it: that finding's own plan would stop the node's work anyway, so waiting
    for an operator stops no less work and only keeps the node's faults, the joining one too, for the
    operator's hours (the same GPU's finding is the fault the held plan answers). Not when either
    plan would be held for anything but that approval (the breaker, a node left out for a person, the rate
    or class limits); its cordon still answers to the breaker and the nodes-out cap. Why it started, or
    None when it stays held."""
    action = str(plan["action"])
    mine = policy.for_action(finding.action)
    if (
        plan["state"] != "held"
        or plan["held_for"] != "approval"
        or finding.gpu_uuid in plan["gpu_uuids"]  # the same GPU's fault, which the held plan answers
        or not policy.for_action(action).starts_when_joined
        or mine.mode != "automatic"
        or "drain" not in mine.steps
    ):
        return None
    for asked, approval in ((finding.action, True), (action, False)):
        held_for, _ = hold_reason(
            conn, policy=policy, action=asked, node=node, dry_run=dry_run, now=now, approval=approval
        )
        if held_for is not None:
            return None
    store.start_held_plan(conn, int(plan["id"]), now)
    return (
        f"{finding.action} would drain {node} without an operator anyway: plan {plan['id']} ({action})"
        " starts without one"
    )


def outranks(finding: Finding, plan: Row, policy: Policy) -> bool:
    """Whether `finding` calls for more than the node's plan, a reset or a reboot not yet carried out,
    can give: a reboot-class finding joining a reset would only have the reset fail its validation."""
    steps = list(plan["steps"])
    remedy = next((i for i, step in enumerate(steps) if step in REMEDY_STEPS), None)
    return (
        remedy is not None
        and int(plan["step"]) <= remedy
        and finding.action in LADDER
        and str(plan["action"]) in LADDER
        and LADDER.index(finding.action) > LADDER.index(str(plan["action"]))
        and policy.for_action(finding.action).mode != "never"
    )


def decide(
    conn: SyncConn, finding: Finding, *, policy: Policy, nodes: NodeMap, dry_run: bool, now: datetime
) -> Decided:
    """Decide on `finding` and write the decision, its plan and its record; nothing twice for one key."""
    if finding.action == "none" or store.decided(conn, finding.decision_key, dry_run) is not None:
        return Decided("")
    answers = {"decision_key": finding.decision_key, "topic": finding.topic, "message": finding.message}
    node = (
        nodes.hostname(finding.gpu_uuid, finding.hostname) or store.gpu_hostname(conn, finding.gpu_uuid) or ""
    )
    choice = choose(conn, finding, answers, policy=policy, node=node, dry_run=dry_run, now=now)
    record = write_decision(conn, finding, node, choice, answers, dry_run=dry_run, now=now)
    if record is None:
        return Decided("")
    return Decided(choice.outcome, choice.plan_id, choice.reason, (record,))


@dataclass(frozen=True, slots=True)
class Choice:
    """What is done about a finding: its outcome, the plan that answers it, and why."""

    outcome: str  # act, held, ignored, joined, unmapped
    plan_id: int | None
    reason: str | None


def choose(
    conn: SyncConn,
    finding: Finding,
    answers: dict[str, Any],
    *,
    policy: Policy,
    node: str,
    dry_run: bool,
    now: datetime,
) -> Choice:
    """Ignore the finding (the policy never acts on it), leave it unmapped (no node), have the node's
    plan take it in, or open a plan for it (one rung above the node's plan, when it outranks it)."""
    if policy.for_action(finding.action).mode == "never":
        return Choice("ignored", None, f"the policy never acts on {finding.action}")
    if not valid_node(node):
        return Choice("unmapped", None, f"GPU {finding.gpu_uuid} maps to no node ({node!r})")
    active = store.active_plan(conn, node, dry_run)
    if active is not None and not outranks(finding, active, policy):
        return join(conn, active, finding, policy=policy, node=node, dry_run=dry_run, now=now)
    return open_for(conn, finding, answers, active, policy=policy, node=node, dry_run=dry_run, now=now)


def join(
    conn: SyncConn, active: Row, finding: Finding, *, policy: Policy, node: str, dry_run: bool, now: datetime
) -> Choice:
    """The node's plan takes the finding in, and starts if it was held for an approval that the
    finding's own plan would not wait for (start_held)."""
    plan_id = int(active["id"])
    store.join_plan(conn, plan_id, finding.gpu_uuid, now)
    reason = f"the node's plan {plan_id} ({active['action']}, {active['state']}) takes it in"
    started = start_held(conn, active, finding, policy=policy, node=node, dry_run=dry_run, now=now)
    return Choice("joined", plan_id, reason if started is None else f"{reason}; {started}")


def open_for(
    conn: SyncConn,
    finding: Finding,
    answers: dict[str, Any],
    active: Row | None,
    *,
    policy: Policy,
    node: str,
    dry_run: bool,
    now: datetime,
) -> Choice:
    """A new plan for the finding, running or held. Over `active`, the node's plan whose remedy, not yet
    tried, the finding needs more than: that plan ends escalated, and the new one takes in its GPUs."""
    escalated_from = None if active is None else int(active["id"])
    if escalated_from is not None:
        store.escalate_plan(conn, escalated_from, now)
    plan_id, held_for, why = open_plan(
        conn,
        policy=policy,
        node=node,
        gpu_uuids=list(dict.fromkeys([*(active or {}).get("gpu_uuids", []), finding.gpu_uuid])),
        action=finding.action,
        finding=finding.name,
        decision_key=finding.decision_key,
        answers=answers,
        dry_run=dry_run,
        now=now,
        escalated_from=escalated_from,
    )
    outcome = "held" if held_for else "act"
    if active is None:
        steps = ", ".join(policy.for_action(finding.action).steps)
        return Choice(outcome, plan_id, why if held_for else f"{finding.action}: {steps}")
    escalated = f"{finding.name} needs {finding.action}: escalated before its remedy (plan {plan_id})"
    ended = event(
        "outcome", at=now, status="escalated", dry_run=dry_run, plan=active, reason=escalated, seconds=0.0
    )
    ledger.insert_events(conn, [ended])
    reason = (
        f"{finding.action} outranks plan {active['id']}'s {active['action']}, not yet carried out:"
        f" escalated to plan {plan_id}" + (f"; {why}" if why else "")
    )
    return Choice(outcome, plan_id, reason)


def write_decision(
    conn: SyncConn,
    finding: Finding,
    node: str,
    choice: Choice,
    answers: dict[str, Any],
    *,
    dry_run: bool,
    now: datetime,
) -> dict[str, Any] | None:
    """The decision's row and its record; None, rolled back, when another consumer decided it first
    (a rebalance): its decision stands."""
    if not store.insert_decision(
        conn,
        decision_key=finding.decision_key,
        at=now,
        gpu_uuid=finding.gpu_uuid,
        node=node,
        action=finding.action,
        outcome=choice.outcome,
        remediation_id=choice.plan_id,
        reason=choice.reason,
        dry_run=dry_run,
    ):
        conn.rollback()
        return None
    record = event(
        "decision",
        at=now,
        status=choice.outcome,
        dry_run=dry_run,
        node=node if valid_node(node) else "",
        gpu_uuid=finding.gpu_uuid,
        action=finding.action,
        reason=choice.reason,
        answers=answers,
    )
    record["remediation_id"] = choice.plan_id
    ledger.insert_events(conn, [record])
    return record

"""Steps the running plans: each due plan locked, one look at its step, state and record committed together.

A plan's state lives in the database (`remediations`), so a restart goes on
where the last committed look left it: a drain resumes with its deadline
counted from when it began, a validation with the cycles it had counted. A
driver that could not answer (the API server restarting, slurmctld busy) is
asked again after `retry_s`, until the drain's deadline; a driver's refusal
fails the step. Nothing advances while the remediator is paused. Each round
first answers the operators' new repair marks (repairs.py). Several
remediators share the plans safely: each plan is locked while one looks at it
(`SKIP LOCKED`: the others move on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.settings.common import DatabaseSettings
from shared.store import remediation as store
from shared.store import remediation_ledger as ledger
from shared.store.errors import translated
from shared.store.remediation import SyncConn
from shared.store.results import Row

from . import repairs
from .decide import open_plan
from .drivers.base import DriverError
from .held import HeldConnection
from .policy import Policy
from .record import event
from .steps import StepContext, StepResult, Steps

log = logging.getLogger(__name__)


@dataclass
class Advanced:
    plan_id: int
    step: str
    next: str
    state: str


class Executor:
    def __init__(
        self,
        *,
        db: DatabaseSettings,
        policy: Policy,
        steps: Steps,
        dry_run: bool,
        retry_s: float,
        batch: int = 50,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`clock`: what time it is for the plans (a simulation's clock in the evaluation)."""
        self.db, self.policy, self.steps, self.dry_run, self.clock = db, policy, steps, dry_run, clock
        self.held = HeldConnection(db)
        self.retry_s, self.batch = retry_s, batch

    def close(self) -> None:
        self.held.close()

    def run_due(self) -> list[Advanced]:
        """One look at every plan that is due; what each did."""
        with self.held.session() as conn:
            if ledger.control(conn, self.dry_run)["paused"]:
                return []
            for mark in repairs.marks(conn, dry_run=self.dry_run, now=self.clock()):
                repairs.answer(conn, mark, dry_run=self.dry_run, now=self.clock())
                with translated(conn):
                    conn.commit()
            due = store.due_plans(conn, dry_run=self.dry_run, now=self.clock(), limit=self.batch)
            conn.rollback()
            done = []
            for plan_id in due:
                if (advanced := self.advance(conn, plan_id)) is not None:
                    done.append(advanced)
            return done

    def advance(self, conn: SyncConn, plan_id: int) -> Advanced | None:
        """One look at one plan's step, committed with its record; None when it was not due after all."""
        now = self.clock()
        plan = store.lock_due(conn, plan_id, now)
        if plan is None:
            conn.rollback()
            return None
        steps: list[str] = list(plan["steps"])
        step = steps[plan["step"]] if plan["step"] < len(steps) else ""
        started = plan["step_started_at"] or now
        ctx = StepContext(conn, plan, dict(plan["detail"]), step, started, now)
        if not step:
            result = StepResult("next")
        else:
            try:
                result = self.steps.handler(step)(ctx)
            except DriverError as e:
                result = self._driver_error(ctx, e)
        state = self._apply(ctx, result)
        with translated(conn):
            conn.commit()
        log.info(
            "plan %s: %s -> %s (%s)",
            plan_id,
            step or "end",
            result.next,
            state,
            extra={"node": ctx.node, "reason": result.reason},
        )
        return Advanced(plan_id, step, result.next, state)

    def _driver_error(self, ctx: StepContext, error: DriverError) -> StepResult:
        deadline = ctx.started + timedelta(seconds=self.policy.drain.deadline_s)
        if error.retriable and ctx.now < deadline:
            if ctx.detail.get("last_error") != str(error):
                ctx.detail["last_error"] = str(error)
                ctx.events.append(ctx.record("action", "in_progress", reason=f"will try again: {error}"))
            return StepResult("wait", reason=str(error), wait_s=self.retry_s)
        ctx.events.append(ctx.record("action", "failed", reason=str(error)))
        return StepResult("fail", reason=str(error))

    def _apply(self, ctx: StepContext, result: StepResult) -> str:
        """Write the plan's new state and the step's record; the plan's new state."""
        plan, detail, now = ctx.plan, ctx.detail, ctx.now
        events = [*ctx.events, *result.events]
        index, state, held_for = int(plan["step"]), "running", None
        next_at = now
        step_started: datetime | None = ctx.started
        if result.next == "next":
            index, step_started = index + 1, None
            detail.pop("last_error", None)
            if index >= len(plan["steps"]):
                state = "done"
                events.append(self._outcome(ctx, "done", f"{plan['action']}: every step done"))
        elif result.next == "wait":
            next_at = now + timedelta(seconds=result.wait_s)
        elif result.next == "hold":
            state, held_for, step_started = "held", result.held_for, None
        elif result.next == "fail":
            state = "failed"
            events.append(
                self._outcome(ctx, "failed", f"{ctx.step} failed, the node stays out: {result.reason}")
            )
        else:  # escalate
            state = "escalated"
        store.update_plan(
            ctx.conn,
            int(plan["id"]),
            at=now,
            step=index,
            state=state,
            held_for=held_for,
            next_at=next_at,
            step_started_at=step_started,
            detail=detail,
        )
        if state == "escalated":
            events += self._escalate(ctx, result.reason or "")
        ledger.insert_events(ctx.conn, events)
        return state

    def _outcome(self, ctx: StepContext, status: str, reason: str) -> dict[str, Any]:
        seconds = (ctx.now - ctx.plan["created_at"]).total_seconds()
        return event(
            "outcome",
            at=ctx.now,
            status=status,
            dry_run=ctx.dry_run,
            plan=ctx.plan,
            reason=reason,
            seconds=max(seconds, 0.0),
        )

    def _escalate(self, ctx: StepContext, why: str) -> list[dict[str, Any]]:
        """The node stays out; the ladder's next rung gets a plan of its own (held if its policy says)."""
        plan: Row = ctx.plan
        rung = self.policy.for_action(str(plan["action"])).on_failure
        if ctx.detail.get("after_repair") is not None:  # a repaired GPU failed: the repair is a person's
            rung = None
        if rung is None or self.policy.for_action(rung).mode == "never":
            return [
                self._outcome(ctx, "escalated", f"{why}; the node stays out (a person takes it from here)")
            ]
        key = f"{plan['decision_key']}#after-{plan['id']}"
        new_id, held_for, held_why = open_plan(
            ctx.conn,
            policy=self.policy,
            node=ctx.node,
            gpu_uuids=list(plan["gpu_uuids"]),
            action=rung,
            finding=str(plan["finding"]),
            decision_key=key,
            answers=ctx.detail.get("answers") or {},
            dry_run=ctx.dry_run,
            now=ctx.now,
            escalated_from=int(plan["id"]),
        )
        outcome = self._outcome(
            ctx, "escalated", f"{why}; the node stays out, escalated to {rung} (plan {new_id})"
        )
        decision = event(
            "decision",
            at=ctx.now,
            status="held" if held_for else "act",
            dry_run=ctx.dry_run,
            node=ctx.node,
            action=rung,
            reason=held_why or f"escalated from plan {plan['id']}",
            answers=ctx.detail.get("answers"),
        )
        decision["remediation_id"] = new_id
        return [outcome, decision]

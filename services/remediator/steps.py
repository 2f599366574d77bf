"""Each step of a plan, one look at a time: what it asks the drivers, what it records, where the plan goes.

A step answers a `StepResult`: go on to the next step, look again later (a
drain in progress, a validation waiting for cycles), hold the plan for an
operator (the breaker), fail it (the node stays out, an operator looks), or
escalate it (the validation failed: the node stays out and the next rung of
the ladder gets a plan). In dry-run no driver is called: each step records
what it would have done and goes on, and the breaker counts the nodes it would
have taken out (its own breaker, never the live one's). A dry run's validation
lasts as long as the live one would at least (its scoring cycles), so its plan
stays open as the live one would and later findings join it; it is assumed to
pass where the plan returns the node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from shared.store import remediation as store
from shared.store import remedies
from shared.store.remediation import SyncConn
from shared.store.results import Row

from . import validation
from .breaker import admit_node
from .drivers.base import DriverResult, SchedulerDriver
from .drivers.node_exec import NodeExec
from .findings import NodeMap
from .policy import Policy
from .record import event

Next = Literal["next", "wait", "hold", "fail", "escalate"]


@dataclass
class StepResult:
    next: Next
    events: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    held_for: str | None = None
    wait_s: float = 0.0


@dataclass
class StepContext:
    """What a step works with: the plan (locked), its detail (changed in place), and when it started."""

    conn: SyncConn
    plan: Row
    detail: dict[str, Any]
    step: str
    started: datetime
    now: datetime
    events: list[dict[str, Any]] = field(default_factory=list)  # what the step did, recorded with it
    looked: float = field(default_factory=time.perf_counter)  # `now`, on the process's own clock

    @property
    def node(self) -> str:
        return str(self.plan["node"])

    @property
    def plan_id(self) -> int:
        return int(self.plan["id"])

    @property
    def dry_run(self) -> bool:
        return bool(self.plan["dry_run"])

    def gpus(self) -> dict[str, int]:
        """The plan's GPUs with their indexes (the inventory's, as the plan opened)."""
        identity: dict[str, int] = self.detail.get("identity") or {}
        return {u: int(identity.get(u, -1)) for u in self.plan["gpu_uuids"]}

    def answered(self, driver: str, answer: DriverResult, seconds: float | None) -> dict[str, Any]:
        """The record of a driver's answer to this step."""
        return self.record(
            "action",
            answer.status,
            driver=driver,
            reason=answer.reason,
            response=answer.response,
            seconds=seconds,
        )

    def record(self, kind: str, status: str, **fields: Any) -> dict[str, Any]:
        return event(
            kind, at=self.now, status=status, dry_run=self.dry_run, plan=self.plan, step=self.step, **fields
        )


class Steps:
    """The step handlers, with the drivers and the policy they act by."""

    def __init__(
        self,
        *,
        policy: Policy,
        schedulers: list[SchedulerDriver],
        node_exec: NodeExec,
        nodes: NodeMap,
        look_s: float,
    ) -> None:
        self.policy, self.schedulers, self.node_exec, self.nodes = policy, schedulers, node_exec, nodes
        self.look_s = look_s

    def handler(self, step: str) -> Callable[[StepContext], StepResult]:
        return {
            "cordon": self.cordon,
            "drain": self.drain,
            "reset_gpu": self.reset_gpu,
            "reboot": self.reboot,
            "validate": self.validate,
            "return": self.put_back,
            "keep_out": self.keep_out,
        }[step]

    def _each_scheduler(
        self,
        ctx: StepContext,
        call: Callable[[SchedulerDriver, str], DriverResult],
        only: Callable[[SchedulerDriver], bool] = lambda _: True,
    ) -> list[tuple[str, DriverResult]]:
        """`call` on each scheduler (by the node's name there), each answer recorded; dry-run records only."""
        if ctx.dry_run:
            names: list[str | None] = [s.name for s in self.schedulers] or [None]
            ctx.events.extend(
                ctx.record("action", "dry_run", driver=name, reason=f"would {ctx.step} {ctx.node}")
                for name in names
            )
            return []
        answers: list[tuple[str, DriverResult]] = []
        for scheduler in self.schedulers:
            if not only(scheduler):
                continue
            started = time.perf_counter()
            answer = call(scheduler, self.nodes.scheduler_name(ctx.node, scheduler.name))
            answers.append((scheduler.name, answer))
            ctx.events.append(ctx.answered(scheduler.name, answer, time.perf_counter() - started))
        return answers

    def cordon(self, ctx: StepContext) -> StepResult:
        answer, why = admit_node(
            ctx.conn,
            node=ctx.node,
            dry_run=ctx.dry_run,
            plan_id=ctx.plan_id,
            policy=self.policy.breaker,
            cap=self.policy.nodes_out,
            now=ctx.now,
        )
        if answer != "admit":
            events = (
                [ctx.record("breaker", "tripped", driver="database", reason=why)] if answer == "trip" else []
            )
            events.append(ctx.record("action", "held", reason=f"not taken out: {why}"))
            return StepResult("hold", events, why, held_for="nodes_out" if answer == "cap" else "breaker")
        finding = str(ctx.plan["finding"])
        answers = self._each_scheduler(
            ctx, lambda s, name: s.take_out(name, finding=finding, plan_id=ctx.plan_id)
        )
        for name, result in answers:
            if result.status == "ok":
                store.own(
                    ctx.conn, node=ctx.node, scheduler=name, dry_run=False, plan_id=ctx.plan_id, at=ctx.now
                )
        return _after(answers)

    def drain(self, ctx: StepContext) -> StepResult:
        past = ctx.now >= ctx.started + timedelta(seconds=self.policy.drain.deadline_s)
        done: list[str] = ctx.detail.setdefault("drained", [])
        last: dict[str, Any] = ctx.detail.setdefault("drain_seen", {})
        if ctx.dry_run:
            self._each_scheduler(ctx, lambda s, n: s.drain(n, past_deadline=past))
            return StepResult("next")
        answers: list[tuple[str, DriverResult]] = []
        for scheduler in self.schedulers:
            if scheduler.name in done:
                continue
            answer = scheduler.drain(self.nodes.scheduler_name(ctx.node, scheduler.name), past_deadline=past)
            answers.append((scheduler.name, answer))
            if answer.status == "in_progress" and last.get(scheduler.name) == answer.response:
                continue  # nothing changed since the last look: nothing new to record
            last[scheduler.name] = answer.response
            seconds = (ctx.now - ctx.started).total_seconds() if answer.status != "in_progress" else None
            ctx.events.append(ctx.answered(scheduler.name, answer, seconds))
            if answer.status == "ok":
                done.append(scheduler.name)
        return _after(answers, look_s=self.look_s)

    def _on_node(self, ctx: StepContext, operation: Literal["reset_gpu", "reboot"]) -> DriverResult | None:
        """Reset the plan's GPUs or reboot the node. Done, it is a remedy as of its answer: live, a
        gpu_remedies row per GPU (the scorer counts nothing it resolves from before it); in a dry run,
        only the plan's record of it. The validation judges what was seen after it."""
        seen_before = validation.baseline(ctx.conn, ctx.node)
        gpus = ctx.gpus() if operation == "reset_gpu" else dict(ctx.detail.get("identity") or ctx.gpus())
        driver = self.node_exec.driver_of(operation)
        if ctx.dry_run:
            ctx.events.append(ctx.record("action", "dry_run", driver=driver, reason=f"would {operation}"))
            result = None
        else:
            started = time.perf_counter()
            result = self.node_exec.run(operation, node=ctx.node, gpus=gpus, plan_id=ctx.plan_id)
            ctx.events.append(ctx.answered(driver, result, time.perf_counter() - started))
            if result.status != "ok":
                return result
        at = ctx.now + timedelta(seconds=time.perf_counter() - ctx.looked)  # when it answered
        ctx.detail["validation"] = {"seen_before": seen_before, "remedied_at": validation.iso(at)}
        remedy: remedies.Remedy = "reset_gpu" if operation == "reset_gpu" else "reboot_node"
        note = f"plan {ctx.plan_id}: {operation} on {ctx.node} ({ctx.plan['finding']})"
        if not ctx.dry_run:
            remedies.record(ctx.conn, list(gpus), at=at, remedy=remedy, plan_id=ctx.plan_id, note=note)
        ctx.events.append(
            ctx.record("action", "remedied", driver="database", reason=note, response={"gpus": sorted(gpus)})
        )
        return result

    def reset_gpu(self, ctx: StepContext) -> StepResult:
        result = self._on_node(ctx, "reset_gpu")
        if result is not None and result.status != "ok":
            return StepResult("escalate", reason=result.reason)  # a GPU that will not reset: one rung up
        return StepResult("next")

    def reboot(self, ctx: StepContext) -> StepResult:
        result = self._on_node(ctx, "reboot")
        if result is not None and result.status != "ok":
            return StepResult("fail", reason=result.reason)  # the node stays out; a person looks
        return StepResult("next")

    def validate(self, ctx: StepContext) -> StepResult:
        rules = self.policy.validation
        state = ctx.detail.setdefault("validation", {})
        timed_out = ctx.now >= ctx.started + timedelta(seconds=rules.timeout_s)
        identity = {u: int(i) for u, i in (ctx.detail.get("identity") or ctx.gpus()).items()}
        if ctx.dry_run:
            looked = validation.assume(
                ctx.conn,
                identity=identity,
                state=state,
                rules=rules,
                returns="return" in ctx.plan["steps"],
                timed_out=timed_out,
            )
        else:
            looked = validation.look(
                ctx.conn,
                node=ctx.node,
                plan_id=ctx.plan_id,
                identity=identity,
                state=state,
                rules=rules,
                node_exec=self.node_exec,
                timed_out=timed_out,
            )
        ctx.detail["validation"] = looked.state
        events = []
        if looked.compute is not None:
            events.append(
                ctx.record(
                    "action",
                    looked.compute.status,
                    driver=self.node_exec.driver_of("compute_check"),
                    reason=looked.compute.reason,
                    response=looked.compute.response,
                )
            )
        seconds = (ctx.now - ctx.started).total_seconds()
        if looked.verdict == "passed":
            events.append(ctx.record("validation", "passed", reason=looked.reason, seconds=seconds))
            return StepResult("next", events)
        if looked.verdict == "failed":
            events.append(
                ctx.record(
                    "validation",
                    "failed",
                    reason=looked.reason,
                    seconds=seconds,
                    response={k: v for k, v in looked.state.items() if k != "seen_before"},
                )
            )
            return StepResult("escalate", events, looked.reason)
        if state.get("said") != looked.reason:  # a new thing to say (the look's state is what is kept)
            looked.state["said"] = looked.reason
            events.append(ctx.record("validation", "in_progress", reason=looked.reason))
        return StepResult("wait", events, looked.reason, wait_s=self.look_s)

    def put_back(self, ctx: StepContext) -> StepResult:
        def owned(scheduler: SchedulerDriver) -> bool:
            if store.owned(ctx.conn, node=ctx.node, scheduler=scheduler.name, dry_run=False):
                return True
            ctx.events.append(
                ctx.record(
                    "action",
                    "not_owned",
                    driver=scheduler.name,
                    reason="not taken out by the remediator: stays as it is",
                )
            )
            return False

        answers = self._each_scheduler(ctx, lambda s, name: s.put_back(name), only=owned)
        for name, result in answers:
            if result.status == "ok":
                store.disown(ctx.conn, node=ctx.node, scheduler=name, dry_run=False)
        return _after([(n, r) for n, r in answers if r.status != "not_owned"])

    def keep_out(self, ctx: StepContext) -> StepResult:
        return StepResult(
            "next",
            [
                ctx.record(
                    "action",
                    "ok" if not ctx.dry_run else "dry_run",
                    reason="kept out of service: a person takes it from here, and returns it",
                )
            ],
        )


def _after(answers: list[tuple[str, DriverResult]], look_s: float = 0.0) -> StepResult:
    failed = [f"{name}: {r.reason}" for name, r in answers if r.status == "failed"]
    if failed:
        return StepResult("fail", reason="; ".join(failed))
    if any(r.status == "in_progress" for _, r in answers):
        return StepResult("wait", wait_s=look_s)
    return StepResult("next")

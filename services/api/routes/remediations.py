"""The remediator: its plans (pending, running, failed), one plan's record, its pause and breaker, and an
admin's pause, resume, breaker reset and approval (each recorded under the token's subject)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from shared.store import remediation_ledger as ledger

from ..answers import problems
from ..answers.remediations import Plan, PlanDetail, Plans, Remediator
from ..deps import Admin, Db
from ..paging import decode_cursor, page
from ..parameters import PLAN_STATES, NoQuery, PlansQuery

router = APIRouter(tags=["remediations"])

ADMIN_REFUSALS = {401: "no bearer token, or one refused", 403: "the caller is not an admin"}
PlanId = Annotated[int, Path(ge=1, le=2**62)]


@router.get("/remediations")
async def remediations(db: Db, query: Annotated[PlansQuery, Query()]) -> Plans:
    """Remediation plans, newest first: pending (held for an operator), running, failed, escalated, done."""
    (before,) = decode_cursor(query.cursor, [int]) if query.cursor else [None]
    states = PLAN_STATES[query.state]
    dry_run = {"live": False, "dry_run": True, "both": None}[query.mode]
    async with db.reading() as conn:
        found = await ledger.plans_page(
            conn, states=states, dry_run=dry_run, limit=query.limit + 1, before=before
        )
        total = await ledger.plans_count(conn, states=states, dry_run=dry_run)
    return Plans.model_validate(
        page("remediations", found, total=total, limit=query.limit, key=lambda r: (r["id"],))
    )


@router.get("/remediations/{plan_id}", responses=problems({404: "no such plan"}))
async def remediation(db: Db, plan_id: PlanId, query: Annotated[NoQuery, Query()]) -> PlanDetail:
    """One plan and its record, in order: each decision, action, outcome and validation."""
    async with db.reading() as conn:
        found = await ledger.plan_with_events(conn, plan_id)
    if found is None:
        raise HTTPException(404, f"no remediation {plan_id}")
    for record in found["events"]:
        record["record_id"] = str(record["record_id"])
        record["response"] = without_commands(record["response"])
    return PlanDetail.model_validate(found)


def without_commands(response: Any) -> Any:
    """A record's response without the command lines and URLs the exec driver once kept in its runs
    (records written before it stopped): they may name hosts and secrets no reader should see."""
    if isinstance(response, dict) and isinstance(response.get("runs"), list):
        runs = [
            {k: v for k, v in run.items() if k not in ("argv", "url")} if isinstance(run, dict) else run
            for run in response["runs"]
        ]
        return {**response, "runs": runs}
    return response


@router.post(
    "/remediations/{plan_id}/approve",
    responses=problems({**ADMIN_REFUSALS, 404: "no such plan", 409: "the plan is not pending"}),
)
async def approve(db: Db, plan_id: PlanId, query: Annotated[NoQuery, Query()], who: Admin) -> Plan:
    """Approve a pending plan (an admin's): it runs from the step it waited at."""
    async with db.acknowledging() as conn:
        done = await ledger.approve(conn, plan_id, who.subject)
    async with db.reading() as conn:
        if done is not None:
            return Plan.model_validate(await ledger.plan_brief(conn, plan_id))
        state = await ledger.plan_state(conn, plan_id)
    if state is None:
        raise HTTPException(404, f"no remediation {plan_id}")
    raise HTTPException(409, f"remediation {plan_id} is {state}, not pending")


@router.get("/remediator")
async def remediator(db: Db, query: Annotated[NoQuery, Query()]) -> Remediator:
    """Whether the remediator is paused and its circuit breaker open, for the live run and the dry run."""
    async with db.reading() as conn:
        return Remediator.model_validate({"modes": await ledger.controls(conn)})


async def _operate(db: Db, what: str, by: str) -> Remediator:
    async with db.acknowledging() as conn:
        modes = await ledger.operate(conn, what, by)
    return Remediator.model_validate({"modes": sorted(modes, key=lambda m: m["dry_run"])})


@router.post("/remediator/pause", responses=problems(ADMIN_REFUSALS))
async def pause(db: Db, query: Annotated[NoQuery, Query()], who: Admin) -> Remediator:
    """Pause the remediator (an admin's): no plan moves on until it is resumed."""
    return await _operate(db, "pause", who.subject)


@router.post("/remediator/resume", responses=problems(ADMIN_REFUSALS))
async def resume(db: Db, query: Annotated[NoQuery, Query()], who: Admin) -> Remediator:
    """Resume a paused remediator (an admin's)."""
    return await _operate(db, "resume", who.subject)


@router.post("/remediator/reset-breaker", responses=problems(ADMIN_REFUSALS))
async def reset_breaker(db: Db, query: Annotated[NoQuery, Query()], who: Admin) -> Remediator:
    """Close the circuit breaker (an admin's); the plans it held stay pending until each is approved."""
    return await _operate(db, "reset", who.subject)

"""The remediator's answers: its plans (pending, running, failed...), a plan and its record, its controls."""

from __future__ import annotations

from pydantic import Field

from . import Answer, ApiTime, NextCursor, StoredObject, Total


class PlanHead(Answer):
    """What every answer about a plan starts with: its node, action and where it is."""

    id: int
    node: str
    gpu_uuids: list[str]
    action: str
    finding: str = Field(description="what was found: named in the node's taint and Slurm reason")
    steps: list[str]
    step: int = Field(description="index in `steps` of the step in hand (= len(steps) when done)")
    state: str = Field(description="held (pending an operator), running, done, failed or escalated")
    held_for: str | None = Field(
        description="why a held plan waits: approval, breaker, rate_limit, class_limit"
    )
    dry_run: bool


class Plan(PlanHead):
    """A remediation plan as listed: one node, the action it carries out, the step it is at."""

    escalated_from: int | None
    created_at: ApiTime
    updated_at: ApiTime
    step_started_at: ApiTime | None
    approved_by: str | None
    approved_at: ApiTime | None


class Plans(Answer):
    remediations: list[Plan]
    total: Total
    limit: int
    next_cursor: NextCursor


class Record(Answer):
    """One decision, action, outcome, validation or control of the plan (as on gpu-remediations)."""

    time: ApiTime
    record_id: str
    kind: str
    step: str | None
    driver: str | None
    status: str
    reason: str | None
    seconds: float | None
    response: StoredObject


class PlanDetail(PlanHead):
    """One plan as stored, with its record."""

    decision_key: str = Field(description="the verdict or alert the plan answers (its idempotence key)")
    escalated_from: int | None
    created_at: ApiTime
    updated_at: ApiTime
    next_at: ApiTime = Field(description="when a running plan's step is looked at again")
    step_started_at: ApiTime | None
    approved_by: str | None
    approved_at: ApiTime | None
    detail: StoredObject = Field(
        description="the plan's working state: the identity it saw, drains, validation"
    )
    events: list[Record]


class Control(Answer):
    """The pause and the circuit breaker of one mode (the dry run has its own)."""

    dry_run: bool
    paused: bool
    paused_by: str | None
    paused_at: ApiTime | None
    breaker: str = Field(description="closed, or open: nothing is taken out until an operator resets it")
    tripped_at: ApiTime | None
    trip_reason: str | None
    reset_by: str | None
    reset_at: ApiTime | None


class Remediator(Answer):
    modes: list[Control]

"""The remediator's topic: `RemediationRecord` (gpu-remediations, keyed by GPU UUID, else by node).

One record for each thing the remediator decided or did, in the order it did
them: a *decision* answering one verdict or alert (what it will do, or why
not), each *action* of a remediation (a step on one driver: cordon, drain,
reset, reboot, compute check, return to service), the remediation's *outcome*,
each *validation* before a node returns, the *breaker* tripping or being reset,
an operator's *control* (pause, resume, approve), and each *refusal* of a verdict
or alert the remediator could not believe (services/remediator/trust.py: no
decision, no plan; `reason` says why, `response` where it was read). Each carries the verdict
or alert it answers (`answers`), the driver's response and the time the step
took. The same record is a row of the `remediation_events` hypertable
(schema/0030); `record_id` is that row's key, so a consumer drops a record it
has already seen (the remediator may publish one twice after a crash, never
zero times).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from gpuhealth.contract.base import (
    GpuUuid,
    StrictModel,
    TopicMessage,
    UtcTime,
    parse_message,
)
from shared.contract.models_health import Evidence, Hostname, Name, Text

RecordKind = Literal["decision", "action", "outcome", "validation", "breaker", "control", "refusal"]
RECORD_KINDS: tuple[RecordKind, ...] = get_args(RecordKind)
# What a remediation does, in the order a plan may hold them (the policy file lists them per action);
# keep_out ends a plan that leaves the node out of service for a person (inspection, repair).
Step = Literal["cordon", "drain", "reset_gpu", "reboot", "validate", "return", "keep_out"]
STEPS: tuple[Step, ...] = get_args(Step)
Driver = Literal["kubernetes", "slurm", "exec", "webhook", "database"]
Status = Literal[
    # decisions: what the remediator does about one verdict or alert
    "act",
    "held",
    "ignored",
    "joined",
    "unmapped",
    # actions and validations
    "ok",
    "dry_run",
    "in_progress",
    "not_owned",
    "failed",
    "passed",
    # outcomes; a remedy carried out (its reset or reboot step, an operator's by hand)
    "done",
    "escalated",
    "withdrawn",
    "remedied",
    # breaker and control
    "tripped",
    "reset",
    "paused",
    "resumed",
    "approved",
    # a verdict or alert not believed
    "refused",
]
STATUSES: tuple[Status, ...] = get_args(Status)
# Why a decision or a remediation waits for an operator.
HeldFor = Literal["approval", "breaker", "rate_limit", "class_limit", "nodes_out"]
HELD_FOR: tuple[HeldFor, ...] = get_args(HeldFor)


class Answers(StrictModel):
    """The verdict or alert a record answers: its idempotence key and the message itself."""

    decision_key: Annotated[str, Field(min_length=1, max_length=400, pattern=r"^[^\x00-\x1f\x7f]*$")]
    topic: Name
    message: Evidence


class RemediationRecord(TopicMessage):
    """One decision, action, outcome, validation, breaker change or control (gpu-remediations)."""

    time: UtcTime
    record_id: Annotated[
        str, Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    ]
    kind: RecordKind
    remediation_id: int | None = Field(ge=1, lt=2**63)
    gpu_uuid: GpuUuid | None
    node: Hostname  # "" for what concerns the whole fleet (the breaker, a pause)
    action: Name | None  # the verdict's recommended action (shared.contract.models_health's ladder)
    step: Step | None
    driver: Driver | None
    status: Status
    dry_run: bool
    reason: Text | None
    seconds: Annotated[float, Field(ge=0, le=10**7)] | None  # how long the step took
    answers: Answers | None
    response: Evidence  # what the driver (or the database, for control) answered


def parse_remediation(raw: bytes | str) -> RemediationRecord:
    """Validate one gpu-remediations message; ContractError says why it is refused."""
    return parse_message(RemediationRecord, raw)

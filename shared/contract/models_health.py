"""The scorer's topics: `HealthVerdict` (gpu-health) and `AlertOpened` / `AlertResolved` (gpu-alerts).

This module is also the one definition of the health contract's values: the
subsystems, the verdict states, the recommended actions (in escalation order),
and the alerts' severities and states. The scorer, the API and the database's
CHECK constraints (schema/0004_health.sql) all speak these.

A `HealthVerdict` is one change of one GPU subsystem's verdict, published by
the scorer after the cycle that decided it is committed. gpu-alerts carries
the scorer's alerts (an `AlertOpened` when one opens, an `AlertResolved` when
its evidence is gone; `source` is ``scorer``) and a training job's alerts
(:class:`gpuhealth.contract.training.TrainingAlert`, `source` ``training``);
:func:`parse_alert` tells them apart. Validation is as strict as the sample
contract's: schema_version required on the wire, unknown fields, wrong types,
NaN/Infinity, NUL characters and lone surrogates refused with the field named.
Times are written by gpuhealth.contract.wire_time, like every topic's.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, get_args

from pydantic import Field
from typing_extensions import TypeAliasType

from gpuhealth.contract.base import (
    GpuUuid,
    TopicMessage,
    UtcTime,
    parse_message,
)
from gpuhealth.contract.jsonlimits import check_bounds
from gpuhealth.contract.training import TrainingAlert, parse_training_alert
from shared.plumbing.errors import ContractError

HealthState = Literal["healthy", "degraded", "unhealthy"]
HEALTH_STATES: tuple[HealthState, ...] = get_args(HealthState)  # best to worst
# history: what the GPU's record over days says (the rules file's pattern rules), beside what it shows now
Subsystem = Literal["memory", "thermal", "power", "pcie", "nvlink", "xid", "availability", "history"]
SUBSYSTEMS: tuple[Subsystem, ...] = get_args(Subsystem)
Action = Literal[
    "none",
    "restart_workload",
    "reset_gpu",
    "reboot_node",
    "inspect",
    "run_diagnostics",
    "check_mechanicals",
    "send_for_repair",
]
# The action ladder, cheapest first: each rung takes the GPU (or more) out of service for longer,
# or costs more people, than the one below it. A verdict at a rung says the rungs below it are not
# enough; the same fault after an action moves one rung up (services/scorer/escalation.py).
LADDER: tuple[Action, ...] = get_args(Action)
# Why each rung is where it is. The scorer, the API (/api/v1/reference/actions), the page and the
# CLI all read this table.
ACTION_REASONS: dict[Action, str] = {
    "none": "Nothing is wrong enough to act on; the finding is for the record.",
    "restart_workload": "The job's fault or a transient: restart the job; the GPU needs nothing.",
    "reset_gpu": "The GPU's state is bad but a reset restores it; only this GPU leaves service, briefly.",
    "reboot_node": "A reset cannot reach the fault (the GPU left the bus, or the driver must start "
    "again): the node and all its GPUs restart.",
    "inspect": "Automatic remedies are spent or the cause is unknown: a person reads the evidence (and "
    "asks NVIDIA support where the catalogue says so) before the GPU leaves service for longer.",
    "run_diagnostics": "A hardware fault is suspected but not proven: drain the GPU and run DCGM's "
    "diagnostics (dcgmi diag -r 3, or this project's compute check); back in service if they pass.",
    "check_mechanicals": "The signs point at seating, cabling, power or cooling: a technician powers "
    "the node down and reseats or replaces the part.",
    "send_for_repair": "The GPU cannot be repaired in place (spare memory used up, faults after every "
    "remedy): it leaves the fleet for repair or replacement.",
}
# Repeats of one fault alone climb no higher than this; the rungs above it take the GPU out of
# service for long and are reached only by a rule that names them (the catalogue, a workflow,
# a pattern rule), never by counting repeats.
REPEAT_CEILING: Action = "inspect"
AlertSeverity = Literal["info", "warning", "critical"]
ALERT_SEVERITIES: tuple[AlertSeverity, ...] = get_args(AlertSeverity)
AlertState = Literal["open", "acknowledged", "resolved"]  # acknowledged: by an operator, in the API
ALERT_STATES: tuple[AlertState, ...] = get_args(AlertState)

# No NUL (PostgreSQL text cannot hold it) and, as a pattern, no lone surrogate either.
Text = Annotated[str, Field(max_length=1000, pattern=r"^[^\x00]*$")]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
# The inventory's hostname; "" where the inventory does not know the GPU (it has left the fleet).
Hostname = Annotated[str, Field(max_length=253, pattern=r"^[^\x00-\x1f\x7f]*$")]
Summary = Annotated[str, Field(min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]*$")]
# What decided a verdict or an alert: counts, values, windows, times, lists of them.
EvidenceValue = TypeAliasType(
    "EvidenceValue",
    "bool | Annotated[int, Field(ge=-(2**63), lt=2**63)] | float | Text"
    " | Annotated[list[EvidenceValue], Field(max_length=1000)]"
    " | Annotated[dict[Name, EvidenceValue], Field(max_length=64)] | None",
)
Evidence = Annotated[dict[Name, EvidenceValue], Field(max_length=64)]


class HealthVerdict(TopicMessage):
    """One GPU subsystem's verdict changed (gpu-health, keyed by GPU UUID), as of a scoring cycle."""

    time: UtcTime  # the as-of time of the cycle that decided it
    gpu_uuid: GpuUuid
    hostname: Hostname
    subsystem: Subsystem
    state: HealthState
    previous: HealthState | None  # null: the GPU's first verdict for this subsystem
    rule: Name | None  # null when healthy: no rule found anything
    action: Action
    evidence: Evidence


class _ScorerAlert(TopicMessage):
    """What each scorer alert message says: which alert (gpu_alerts.id), of which GPU, of what kind."""

    time: UtcTime
    source: Literal["scorer"] = "scorer"
    alert_id: int = Field(ge=1, lt=2**63)
    gpu_uuid: GpuUuid
    hostname: Hostname
    # unhealthy_<subsystem>, thermal, memory_pressure, power_limit, idle_while_allocated
    kind: Name


class AlertOpened(_ScorerAlert):
    """The scorer opened an alert (gpu-alerts, keyed by GPU UUID)."""

    severity: AlertSeverity
    state: Literal["open"]
    summary: Summary
    evidence: Evidence


class AlertResolved(_ScorerAlert):
    """The scorer resolved an alert: its evidence is gone (gpu-alerts, keyed by GPU UUID)."""

    state: Literal["resolved"]


GpuAlert = AlertOpened | AlertResolved | TrainingAlert


def parse_health_verdict(raw: bytes | str) -> HealthVerdict:
    """Validate one gpu-health message; ContractError says why it is refused."""
    return parse_message(HealthVerdict, raw)


def parse_alert(raw: bytes | str) -> GpuAlert:
    """Validate one gpu-alerts message of any producer; ContractError says why it is refused.

    `source` names the producer (``training``; ``scorer``, or absent in messages the
    scorer wrote before it said so) and `state` which of the scorer's messages it is.
    """
    check_bounds(raw)
    try:
        head = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ContractError(f"value is not JSON: {e}") from e
    if not isinstance(head, dict):
        raise ContractError("value is not a JSON object")
    source, state = head.get("source", "scorer"), head.get("state")
    if source == "training":
        return parse_training_alert(raw)
    if source != "scorer":
        raise ContractError(f"source: unknown gpu-alerts source {_shown(source)}")
    if state == "open":
        return parse_message(AlertOpened, raw)
    if state == "resolved":
        return parse_message(AlertResolved, raw)
    raise ContractError(f"state: unknown alert state {_shown(state)}")


def _shown(value: object) -> str:
    """A refused value as an error message quotes it: short, whatever it was."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The lifecycle service's topic: `LifecycleDecision` (gpu-lifecycle), one GPU's decision at one run.

A decision says what to do with a GPU (keep it, reset or reseat it, send it
for RMA or repair, move it to inference, retire it; `undecided` where the
failure predictor had no answer), every option's expected cost over the
horizon with its parts, every input with where it came from, and each input
that was missing with how its range changes the answer. The same rows are in
the lifecycle_decisions hypertable (schema/0060_lifecycle.sql).
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal, get_args

from pydantic import Field

from gpuhealth.contract.base import GpuUuid, StrictModel, TopicMessage, UtcTime, parse_message

DecisionName = Literal["keep", "reset", "rma", "repair", "repurpose", "retire", "undecided"]
DECISIONS: tuple[DecisionName, ...] = get_args(DecisionName)
Text = Annotated[str, Field(max_length=2000, pattern=r"^[^\x00-\x1f\x7f]*$")]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
Money = Annotated[float, Field(ge=0, le=1e15)]
TermValue = bool | Annotated[int, Field(ge=-(2**63), lt=2**63)] | float | Text | None


class OptionPriced(StrictModel):
    option: Literal["keep", "reset", "rma", "repair", "repurpose", "retire"]
    expected_cost: Money | None  # null: the option does not apply (`note` says why)
    parts: Annotated[dict[Name, float], Field(max_length=32)]
    note: Text


class DecisionTerm(StrictModel):
    name: Name
    value: TermValue
    source: Literal[
        "predictor", "calibration", "scorer", "metrics", "workload", "remediation", "inventory", "assumption"
    ]


class MissingInput(StrictModel):
    input: Text
    assumed: TermValue
    effect: Text


class LifecycleDecision(TopicMessage):
    """One GPU's lifecycle decision at one run (gpu-lifecycle, keyed by GPU UUID)."""

    time: UtcTime  # the run's
    gpu_uuid: GpuUuid
    serial: Text | None
    hostname: Text | None
    model: Text | None
    decision: DecisionName
    expected_cost: Money | None  # the choice's; null when undecided
    keep_cost: Money | None
    cost_of_waiting_per_day: Money
    p_fail_30d: Annotated[float, Field(ge=0, le=1)] | None
    warranty_end: date | None
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")]
    horizon_days: Annotated[float, Field(gt=0, le=365)]
    why: Text
    options: Annotated[list[OptionPriced], Field(max_length=16)]
    terms: Annotated[list[DecisionTerm], Field(max_length=128)]
    missing: Annotated[list[MissingInput], Field(max_length=64)]


def parse_lifecycle_decision(raw: bytes | str) -> LifecycleDecision:
    """Validate one gpu-lifecycle message; ContractError says why it is refused."""
    return parse_message(LifecycleDecision, raw)

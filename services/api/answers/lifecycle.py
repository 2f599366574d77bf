"""The lifecycle's answers: the newest run's decisions with totals, one GPU's over time, the inventory."""

from __future__ import annotations

from datetime import date

from pydantic import Field

from shared.contract.models_lifecycle import DecisionName

from . import Answer, ApiTime, NextCursor, StoredList, StoredObject, Total


class LifecycleRun(Answer):
    """A decision run: why it ran, what it read, the assumptions its decisions were priced with."""

    time: ApiTime
    trigger: str
    inventory_file: str | None
    inventory_rows: int
    inventory_problems: int
    gpus: int
    currency: str
    horizon_days: float
    assumptions: StoredObject
    missing_inputs: StoredList = Field(description="what the whole fleet lacked this run, and its effect")


class LifecycleDecisionRow(Answer):
    """One GPU's decision: the choice, its cost and keeping's, and the reasoning (options, terms, missing)."""

    time: ApiTime
    gpu_uuid: str
    serial: str | None
    hostname: str | None
    model: str | None
    decision: DecisionName
    expected_cost: float | None
    keep_cost: float | None
    cost_of_waiting_per_day: float
    p_fail_30d: float | None
    warranty_end: date | None
    why: str
    options: StoredList
    terms: StoredList
    missing: StoredList


class DecisionTotal(Answer):
    decision: DecisionName
    gpus: int
    expected_cost: float
    cost_of_waiting_per_day: float


class LifecycleTotals(Answer):
    gpus: int
    cost_of_waiting_per_day: float = Field(description="summed over every decision the filters match")
    by_decision: list[DecisionTotal]
    said: list[str] = Field(description='one line per decision that acts: "3 GPUs to send for RMA: ..."')


class LifecycleDecisions(Answer):
    """The newest run's decisions, dearest wait first; `run` is null before the first run."""

    run: LifecycleRun | None
    totals: LifecycleTotals
    decisions: list[LifecycleDecisionRow]
    total: Total
    limit: int
    next_cursor: NextCursor


class GpuLifecycle(Answer):
    gpu_uuid: str
    decisions: list[LifecycleDecisionRow]
    total: Total
    limit: int
    next_cursor: NextCursor


class InventoryRow(Answer):
    line: int
    serial: str | None
    gpu_uuid: str | None
    purchase_date: date | None
    purchase_price: float | None
    warranty_end: date | None
    rma_turnaround_days: int | None
    spares_on_hand: int | None
    note: str | None
    loaded_at: ApiTime


class InventoryProblem(Answer):
    line: int = Field(description="0: the whole file was refused")
    gpu: str | None
    problem: str
    loaded_at: ApiTime


class LifecycleInventory(Answer):
    """The operator's inventory as the last run loaded it, the rows it refused, and the run's assumptions."""

    run: LifecycleRun | None
    rows: list[InventoryRow]
    problems: list[InventoryProblem]

"""One decision run: every GPU's inputs and inventory row into a decision, and the rows that record them.

Pure but for the clock it is given: the loop reads the inputs
(shared.store.lifecycle.decision_inputs) and the inventory, this turns them
into decisions, the hypertable's rows, the topic's messages and the run's row.
What the whole fleet lacks this run (an inventory, the remediation history) is
said once in the run's `missing_inputs` and again in every decision it touched.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from shared.contract.models_lifecycle import LifecycleDecision
from shared.plumbing.errors import ConfigError
from shared.store.lifecycle import GpuInputs

from .calibration import Calibration
from .costs import Option, WorkClass
from .decide import Decision, GpuFacts, Term, assumptions, decide
from .inventory import Inventory
from .settings import EconomicsSection

WORK: dict[str | None, WorkClass | None] = {
    "training": "training",
    "inference": "inference",
    "idle": "idle",
    None: None,
}


def baseline_score(weights_file: Path) -> float:
    """The predictor's score for a GPU with no precursor at all: sigmoid(intercept) of its weights file,
    rounded as the predictor reports it."""
    try:
        with weights_file.open("rb") as f:
            intercept = tomllib.load(f)["intercept"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        raise ConfigError(f"{weights_file}: no predictor intercept ({e})") from e
    if not isinstance(intercept, int | float) or isinstance(intercept, bool) or not math.isfinite(intercept):
        raise ConfigError(f"{weights_file}: the intercept must be a number")
    return round(1 / (1 + math.exp(-intercept)) if intercept > -700 else 0.0, 4)


def baseline_p30(weights_file: Path, calibration: Calibration) -> float:
    """A healthy GPU's calibrated p30 (what one back from a reset, a repair or an RMA is priced at)."""
    got = calibration.calibrate(baseline_score(weights_file))
    if got.p_fail_30d is None:
        raise ConfigError(f"{got.said} (the predictor's baseline): run `make calibrate-predictor`")
    return got.p_fail_30d


def facts_of(g: GpuInputs, inventory: Inventory | None) -> GpuFacts:
    return GpuFacts(
        gpu_uuid=g.gpu_uuid,
        p_fail_30d=g.p_fail_30d,
        failed=g.state == "unhealthy",
        finding=g.action,
        utilisation=g.utilisation,
        power_w=g.power_w,
        work=WORK.get(g.work),
        job_gpus=g.job_gpus,
        resets_30d=g.resets_30d,
        inventory=inventory.lookup(serial=g.serial, gpu_uuid=g.gpu_uuid) if inventory else None,
    )


@dataclass(slots=True)
class RunResult:
    run: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    messages: list[LifecycleDecision] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)


def decide_fleet(
    gpus: dict[str, GpuInputs],
    *,
    inventory: Inventory | None,
    inventory_problem: str | None,
    remediation_seen: bool,
    econ: EconomicsSection,
    baseline: float,
    calibration: Calibration | None,
    at: datetime,
    trigger: str,
    inventory_file: Path | None,
) -> RunResult:
    """Every GPU's decision at `at`, as rows for the hypertable and messages for the topic."""
    fleet_missing: list[dict[str, Any]] = []
    if inventory is None:
        why = inventory_problem or "no inventory file is configured (GPUHEALTH_LIFECYCLE__INVENTORY_FILE)"
        fleet_missing.append(
            {
                "input": "the inventory",
                "why": why,
                "effect": "every GPU's warranty, price, turnaround and spares are assumed values",
            }
        )
    if not remediation_seen:
        fleet_missing.append(
            {
                "input": "the remediation history",
                "why": "no remediator decision in 30 days",
                "effect": "priced as not reset lately; each decision says what a reset would change",
            }
        )
    result = RunResult(
        run={
            "time": at,
            "trigger": trigger,
            "inventory_file": str(inventory_file) if inventory_file else None,
            "inventory_rows": len(inventory.entries) if inventory else 0,
            "inventory_problems": len(inventory.problems) if inventory else (1 if inventory_problem else 0),
            "gpus": len(gpus),
            "currency": econ.currency,
            "horizon_days": econ.horizon_days,
            "assumptions": {t.name: t.value for t in assumptions(econ, baseline, calibration)},
            "missing_inputs": fleet_missing,
        }
    )
    for uuid in sorted(gpus):
        g = gpus[uuid]
        facts = facts_of(g, inventory)
        decision = decide(facts, econ, baseline_p30=baseline, today=at.date(), calibration=calibration)
        row = decision_row(at, g, facts, decision, econ)
        result.decisions.append(decision)
        result.rows.append(row)
        result.messages.append(
            LifecycleDecision.model_validate(
                {
                    **{k: v for k, v in row.items() if k not in {"time"}},
                    "time": at,
                    "currency": econ.currency,
                    "horizon_days": econ.horizon_days,
                },
                strict=False,
            )
        )
    return result


def _prediction_terms(g: GpuInputs) -> list[Term]:
    if g.predicted_at is None:
        return []
    said = ", ".join(
        f"{r.get('factor')}={r.get('value')} (+{r.get('log_odds')} log-odds)"
        for r in (g.prediction_reasons or [])[:6]
    )
    return [
        Term("predicted_at", g.predicted_at.isoformat(), "predictor"),
        Term("prediction_reasons", said or "no precursor", "predictor"),
    ]


def decision_row(
    at: datetime, g: GpuInputs, facts: GpuFacts, d: Decision, econ: EconomicsSection
) -> dict[str, Any]:
    body = d.to_json()
    keep = next((o.expected_cost for o in d.options if o.option is Option.KEEP), None)
    chosen = next((o.expected_cost for o in d.options if o.option is d.choice), None)
    inv = facts.inventory
    return {
        "time": at,
        "gpu_uuid": g.gpu_uuid,
        "serial": g.serial or (inv.serial if inv else None),
        "hostname": g.hostname,
        "model": g.model,
        "decision": body["decision"],
        "expected_cost": None if chosen is None else round(chosen, 2),
        "keep_cost": None if keep is None else round(keep, 2),
        "cost_of_waiting_per_day": body["cost_of_waiting_per_day"],
        # the probability the decision was priced with (the calibrated one; the score is among the terms)
        "p_fail_30d": next(
            (t.value for t in d.terms if t.name == "p_fail_30d" and t.source != "assumption"), None
        ),
        "warranty_end": inv.warranty_end if inv else None,
        "why": d.why,
        "options": body["options"],
        "terms": body["terms"]
        + [{"name": t.name, "value": t.value, "source": t.source} for t in _prediction_terms(g)],
        "missing": body["missing"],
    }

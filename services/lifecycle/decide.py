"""From what is known of a GPU to its decision: every input with its source, what was missing, and why.

A decision takes the cheapest option (keep on a tie: it disturbs nothing) and
lists every option with its parts, every input with where it came from, and
each input that was missing: the value it was priced at, and which decision
the ends of its plausible range give. The predictor's score is priced through
its calibration (services/lifecycle/calibration.py), which the terms name.
Where the predictor has no answer, or the calibration no support for its
score, the decision is left open (never a default probability): it says up to
which p30 keeping is cheapest and what is cheapest beyond.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date
from typing import Any

from .calibration import Calibration
from .costs import RESET_FINDINGS, Option, OptionCost, Situation, WorkClass, cheapest, price_options
from .inventory import InventoryEntry
from .settings import EconomicsSection

_P_GRID = tuple(i / 100 for i in range(101))  # where the predictor has no answer: the p30 scanned


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What is known of one GPU; None is an input nobody could supply (the decision lists it)."""

    gpu_uuid: str
    p_fail_30d: float | None = None  # the predictor's score; None: it has no answer for this GPU
    failed: bool = False  # it cannot serve now (the scorer's verdict is unhealthy)
    finding: str | None = None  # the scorer's action now (shared.contract.models_health.LADDER)
    utilisation: float | None = None  # 0..1 over the window
    power_w: float | None = None
    work: WorkClass | None = None
    job_gpus: int | None = None
    resets_30d: int | None = None  # resets, reboots and reseats in the last 30 days (remediation history)
    inventory: InventoryEntry | None = None


@dataclass(frozen=True, slots=True)
class Term:
    name: str
    value: Any
    source: str  # predictor, calibration, scorer, metrics, workload, remediation, inventory, assumption


@dataclass(frozen=True, slots=True)
class Missing:
    input: str
    assumed: Any
    effect: str  # how the answer changes across the input's plausible range


@dataclass(frozen=True, slots=True)
class Decision:
    gpu_uuid: str
    choice: Option | None  # None: left open (the predictor had no answer)
    why: str
    options: tuple[OptionCost, ...]  # cheapest first; those that do not apply last
    terms: tuple[Term, ...]
    missing: tuple[Missing, ...]
    cost_of_waiting_per_day: float  # what keeping costs over the choice, per day; 0 where keep is chosen
    horizon_days: float

    def to_json(self) -> dict[str, Any]:
        """The decision as the hypertable, the topic and the API carry it."""
        return {
            "gpu_uuid": self.gpu_uuid,
            "decision": self.choice.value if self.choice else "undecided",
            "why": self.why,
            "horizon_days": self.horizon_days,
            "cost_of_waiting_per_day": round(self.cost_of_waiting_per_day, 2),
            "options": [
                {
                    "option": o.option.value,
                    "expected_cost": _round(o.expected_cost),
                    "parts": {k: round(v, 2) for k, v in o.parts.items()},
                    "note": o.note,
                }
                for o in self.options
            ],
            "terms": [{"name": t.name, "value": t.value, "source": t.source} for t in self.terms],
            "missing": [{"input": m.input, "assumed": m.assumed, "effect": m.effect} for m in self.missing],
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# --- from what is known to a decision -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Unknown:
    field: str
    label: str
    assumed: Any
    low: Any
    high: Any


def resolve(
    facts: GpuFacts, e: EconomicsSection, today: date, baseline_p30: float, calibration: Calibration | None
) -> tuple[Situation, list[Term], list[_Unknown], str | None]:
    """The situation to price, the terms (inputs and where they came from), what was missing, and why there
    is no failure probability (None where there is one)."""
    inv = facts.inventory
    terms: list[Term] = []
    unknown: list[_Unknown] = []

    def known(name: str, value: Any, source: str) -> Any:
        terms.append(Term(name, value, source))
        return value

    def missing(name: str, label: str, assumed: Any, low: Any, high: Any) -> Any:
        terms.append(Term(name, assumed, "assumption"))
        unknown.append(_Unknown(name, label, assumed, low, high))
        return assumed

    def have(value: Any, name: str, source: str, label: str, assumed: Any, low: Any, high: Any) -> Any:
        return known(name, value, source) if value is not None else missing(name, label, assumed, low, high)

    score = facts.p_fail_30d
    p30: float | None = None
    no_p: str | None = "no failure prediction for this GPU (too little history)"
    if score is not None:
        known("p_fail_30d_score", score, "predictor")
        if calibration is None:
            known("calibration", "none: the predictor's score taken as the probability", "calibration")
            p30, no_p = known("p_fail_30d", score, "predictor"), None
        else:
            got = calibration.calibrate(score)
            known("calibration", got.said, "calibration")
            if got.p_fail_30d is not None:
                p30, no_p = known("p_fail_30d", got.p_fail_30d, "calibration"), None
            else:
                no_p = got.said
    if p30 is None and facts.failed and facts.finding in RESET_FINDINGS:
        # whether the vendor would find a fault in it: priced at a healthy GPU's calibrated p30, and said
        terms.append(Term("p_fail_30d", baseline_p30, "assumption"))
        unknown.append(
            _Unknown("p30", "the failure prediction (would the vendor find a fault?)", baseline_p30, 0.0, 1.0)
        )
        p30 = baseline_p30
    known("failed", facts.failed, "scorer")
    known("finding", facts.finding, "scorer")
    util = have(
        facts.utilisation, "utilisation", "metrics", "utilisation (no metrics in the window)", 0.5, 0.0, 1.0
    )
    power = have(facts.power_w, "power_w", "metrics", "power (no metrics in the window)", 400.0, 0.0, 1000.0)
    work = have(
        facts.work, "work", "workload", "its work (no process listing)", "training", "idle", "inference"
    )
    job = facts.job_gpus
    if work == "training":
        job = have(
            job,
            "job_gpus",
            "workload",
            "the GPUs its job spans",
            e.job_gpus_when_unknown,
            1,
            e.job_gpus_when_unknown * 16,
        )
    resets = have(
        facts.resets_30d,
        "resets_30d",
        "remediation",
        "the remediation history (resets in the last 30 days)",
        0,
        0,
        1,
    )
    no_row = "" if inv else " (the GPU has no inventory row)"
    ends = inv.warranty_end if inv else None
    left = have(
        None if ends is None else float((ends - today).days),
        "warranty_days_left",
        "inventory",
        f"the warranty's end{no_row}",
        0.0,
        0.0,
        e.horizon_days,
    )
    turnaround = have(
        inv.rma_turnaround_days if inv else None,
        "rma_turnaround_days",
        "inventory",
        f"the vendor's RMA turnaround{no_row}",
        e.rma_turnaround_days_when_unknown,
        7.0,
        60.0,
    )
    spares = have(
        None if inv is None or inv.spares_on_hand is None else inv.spares_on_hand > 0,
        "spares",
        "inventory",
        f"spares on hand{no_row}",
        False,
        False,
        True,
    )
    price = have(
        inv.purchase_price if inv else None,
        "purchase_price",
        "inventory",
        f"the purchase price{no_row}",
        e.replacement_price,
        0.0,
        2 * e.replacement_price,
    )
    bought = inv.purchase_date if inv else None
    age = have(
        None if bought is None else round((today - bought).days / 365.25, 3),
        "age_years",
        "inventory",
        f"the purchase date{no_row}",
        e.useful_life_years / 2,
        0.0,
        e.useful_life_years,
    )
    situation = Situation(
        p30=p30 if p30 is not None else 0.0,
        failed=facts.failed,
        finding=facts.finding,
        utilisation=util,
        power_w=power,
        work=work,
        job_gpus=int(job or 0),
        resets_30d=int(resets),
        warranty_days_left=left,
        rma_turnaround_days=turnaround,
        spares=spares,
        purchase_price=price,
        age_years=age,
    )
    return situation, terms, unknown, no_p


def assumptions(e: EconomicsSection, baseline_p30: float, calibration: Calibration | None) -> list[Term]:
    """The fleet-wide assumptions a decision was priced with (the settings, the calibration, and the
    calibrated p30 of a GPU with no precursor)."""
    out = [Term(name, value, "assumption") for name, value in e.model_dump().items()]
    name = calibration.name if calibration else "none: the predictor's score taken as the probability"
    return [
        *out,
        Term("calibration", name, "calibration"),
        Term("baseline_p30", round(baseline_p30, 6), "calibration"),
    ]


def decide(
    facts: GpuFacts,
    e: EconomicsSection,
    *,
    baseline_p30: float,
    today: date,
    calibration: Calibration | None,
) -> Decision:
    """The cheapest option for one GPU, with its terms, every option's cost, and what was missing.

    `baseline_p30`: a healthy GPU's (one back from a fix) calibrated p30; `calibration`: what maps the
    predictor's score to a probability (None: the score is taken as one, as the evaluation's comparison
    does)."""
    s, terms, unknown, no_p = resolve(facts, e, today, baseline_p30, calibration)
    if no_p is not None and not facts.failed:
        return _open(facts, s, e, baseline_p30, terms, unknown, no_p)
    options = price_options(s, e, baseline_p30)
    best = cheapest(options)
    keep = next(o for o in options if o.option is Option.KEEP)
    waiting = (keep.expected_cost or 0.0) - (best.expected_cost or 0.0)
    missing = [Missing(u.label, u.assumed, _sensitivity(s, u, e, baseline_p30, best.option)) for u in unknown]
    why = (
        (
            f"{best.option.value} costs {best.expected_cost:,.0f} {e.currency} over {e.horizon_days:g} days "
            f"against {keep.expected_cost:,.0f} for keeping it"
        )
        if best.option is not Option.KEEP
        else (f"keeping it is cheapest: {keep.expected_cost:,.0f} {e.currency} over {e.horizon_days:g} days")
    )
    return Decision(
        facts.gpu_uuid,
        best.option,
        why,
        tuple(options),
        tuple(terms),
        tuple(missing),
        waiting / e.horizon_days,
        e.horizon_days,
    )


def _sensitivity(s: Situation, u: _Unknown, e: EconomicsSection, baseline: float, chosen: Option) -> str:
    ends = []
    for value in (u.low, u.high):
        other = cheapest(price_options(replace(s, **{u.field: value}), e, baseline)).option
        if other is not chosen:
            ends.append(f"at {value} it would be {other.value}")
    return "; ".join(ends) if ends else f"{chosen.value} from {u.low} to {u.high}"


def _open(
    facts: GpuFacts,
    s: Situation,
    e: EconomicsSection,
    baseline: float,
    terms: list[Term],
    unknown: list[_Unknown],
    no_p: str,
) -> Decision:
    """No probability: where each option is cheapest along p30, instead of a guessed one."""
    bands: list[tuple[float, float, Option]] = []
    for p in _P_GRID:
        best = cheapest(price_options(replace(s, p30=p), e, baseline)).option
        if bands and bands[-1][2] is best:
            bands[-1] = (bands[-1][0], p, best)
        else:
            bands.append((p, p, best))
    said = ", ".join(f"{o.value} for p30 {lo:g}-{hi:g}" for lo, hi, o in bands)
    why = f"{no_p}: left open; {said}"
    missing = [Missing("the failure probability", None, f"{no_p}; {said}")]
    missing += [Missing(u.label, u.assumed, "priced only once a prediction exists") for u in unknown]
    return Decision(facts.gpu_uuid, None, why, (), tuple(terms), tuple(missing), 0.0, e.horizon_days)

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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
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
class Known:
    """What a step reads: the GPU's facts, the settings, the day, and what the steps before it found."""

    facts: GpuFacts
    e: EconomicsSection
    today: date
    baseline_p30: float
    calibration: Calibration | None
    so_far: Mapping[str, Any]  # the situation's fields the steps before set

    @property
    def no_row(self) -> str:
        return "" if self.facts.inventory else " (the GPU has no inventory row)"


@dataclass(frozen=True, slots=True)
class Gap:
    """What a missing input is priced at, and the ends of its plausible range."""

    label: str
    assumed: Any
    low: Any
    high: Any


@dataclass(frozen=True, slots=True)
class _Unknown:
    field: str  # the situation's
    gap: Gap


@dataclass(frozen=True, slots=True)
class Found:
    """What one step found: its terms, the inputs it had to assume, the situation's fields it sets, and (the
    failure prediction's step) why there is no failure probability."""

    terms: tuple[Term, ...] = ()
    unknown: tuple[_Unknown, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    no_p: str | None = None


def _input(name: str, value: Any, source: str, gap: Gap) -> Found:
    """A known input with its source; else its gap's assumed value, listed as missing."""
    if value is not None:
        return Found((Term(name, value, source),), values={name: value})
    return Found((Term(name, gap.assumed, "assumption"),), (_Unknown(name, gap),), {name: gap.assumed})


def prediction(k: Known) -> Found:
    """The predictor's score, through the calibration where there is one; none: why there is no p30."""
    score = k.facts.p_fail_30d
    if score is None:
        return Found(values={"p30": None}, no_p="no failure prediction for this GPU (too little history)")
    scored = Term("p_fail_30d_score", score, "predictor")
    if k.calibration is None:
        taken = Term("calibration", "none: the predictor's score taken as the probability", "calibration")
        return Found((scored, taken, Term("p_fail_30d", score, "predictor")), values={"p30": score})
    got = k.calibration.calibrate(score)
    said = Term("calibration", got.said, "calibration")
    if got.p_fail_30d is None:
        return Found((scored, said), values={"p30": None}, no_p=got.said)
    p30 = Term("p_fail_30d", got.p_fail_30d, "calibration")
    return Found((scored, said, p30), values={"p30": got.p_fail_30d})


def unconfirmed_fault(k: Known) -> Found:
    """A failed GPU a reset may fix, with no p30: whether the vendor would find a fault in it is priced at
    a healthy GPU's calibrated p30, and said."""
    if k.so_far["p30"] is not None or not k.facts.failed or k.facts.finding not in RESET_FINDINGS:
        return Found()
    gap = Gap("the failure prediction (would the vendor find a fault?)", k.baseline_p30, 0.0, 1.0)
    unknown = _Unknown("p30", gap)
    return Found((Term("p_fail_30d", k.baseline_p30, "assumption"),), (unknown,), {"p30": k.baseline_p30})


def verdict(k: Known) -> Found:
    """Whether it failed and the scorer's action now."""
    failed, finding = k.facts.failed, k.facts.finding
    terms = (Term("failed", failed, "scorer"), Term("finding", finding, "scorer"))
    return Found(terms, values={"failed": failed, "finding": finding})


def utilisation(k: Known) -> Found:
    gap = Gap("utilisation (no metrics in the window)", 0.5, 0.0, 1.0)
    return _input("utilisation", k.facts.utilisation, "metrics", gap)


def power(k: Known) -> Found:
    return _input(
        "power_w", k.facts.power_w, "metrics", Gap("power (no metrics in the window)", 400.0, 0.0, 1000.0)
    )


def work(k: Known) -> Found:
    gap = Gap("its work (no process listing)", "training", "idle", "inference")
    return _input("work", k.facts.work, "workload", gap)


def job_gpus(k: Known) -> Found:
    """The GPUs its job spans: asked only of a training job."""
    if k.so_far["work"] != "training":
        return Found(values={"job_gpus": k.facts.job_gpus})
    n = k.e.job_gpus_when_unknown
    return _input("job_gpus", k.facts.job_gpus, "workload", Gap("the GPUs its job spans", n, 1, n * 16))


def resets(k: Known) -> Found:
    gap = Gap("the remediation history (resets in the last 30 days)", 0, 0, 1)
    return _input("resets_30d", k.facts.resets_30d, "remediation", gap)


def warranty(k: Known) -> Found:
    inv = k.facts.inventory
    ends = inv.warranty_end if inv else None
    left = None if ends is None else float((ends - k.today).days)
    gap = Gap(f"the warranty's end{k.no_row}", 0.0, 0.0, k.e.horizon_days)
    return _input("warranty_days_left", left, "inventory", gap)


def rma_turnaround(k: Known) -> Found:
    inv, e = k.facts.inventory, k.e
    gap = Gap(f"the vendor's RMA turnaround{k.no_row}", e.rma_turnaround_days_when_unknown, 7.0, 60.0)
    return _input("rma_turnaround_days", inv.rma_turnaround_days if inv else None, "inventory", gap)


def spares(k: Known) -> Found:
    inv = k.facts.inventory
    has = None if inv is None or inv.spares_on_hand is None else inv.spares_on_hand > 0
    return _input("spares", has, "inventory", Gap(f"spares on hand{k.no_row}", False, False, True))


def purchase_price(k: Known) -> Found:
    inv, price = k.facts.inventory, k.e.replacement_price
    gap = Gap(f"the purchase price{k.no_row}", price, 0.0, 2 * price)
    return _input("purchase_price", inv.purchase_price if inv else None, "inventory", gap)


def age(k: Known) -> Found:
    inv, life = k.facts.inventory, k.e.useful_life_years
    bought = inv.purchase_date if inv else None
    years = None if bought is None else round((k.today - bought).days / 365.25, 3)
    return _input("age_years", years, "inventory", Gap(f"the purchase date{k.no_row}", life / 2, 0.0, life))


Step = Callable[[Known], Found]
# Every input of a decision, in the order its terms are listed; a step reads what the steps before it found.
STEPS: tuple[Step, ...] = (
    prediction,
    unconfirmed_fault,
    verdict,
    utilisation,
    power,
    work,
    job_gpus,
    resets,
    warranty,
    rma_turnaround,
    spares,
    purchase_price,
    age,
)


def resolve(
    facts: GpuFacts, e: EconomicsSection, today: date, baseline_p30: float, calibration: Calibration | None
) -> tuple[Situation, list[Term], list[_Unknown], str | None]:
    """The situation to price, the terms (inputs and where they came from), what was missing, and why there
    is no failure probability (None where there is one): the steps of STEPS, in turn."""
    terms: list[Term] = []
    unknown: list[_Unknown] = []
    values: dict[str, Any] = {}
    no_p: str | None = None
    known = Known(facts, e, today, baseline_p30, calibration, values)
    for step in STEPS:
        found = step(known)
        terms += found.terms
        unknown += found.unknown
        values.update(found.values)
        no_p = found.no_p or no_p
    p30, job, resets = values.pop("p30"), values.pop("job_gpus"), values.pop("resets_30d")
    p30 = 0.0 if p30 is None else p30
    situation = Situation(p30=p30, job_gpus=int(job or 0), resets_30d=int(resets), **values)
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
    missing = [
        Missing(u.gap.label, u.gap.assumed, _sensitivity(s, u, e, baseline_p30, best.option)) for u in unknown
    ]
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
    for value in (u.gap.low, u.gap.high):
        other = cheapest(price_options(replace(s, **{u.field: value}), e, baseline)).option
        if other is not chosen:
            ends.append(f"at {value} it would be {other.value}")
    return "; ".join(ends) if ends else f"{chosen.value} from {u.gap.low} to {u.gap.high}"


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
    missing += [Missing(u.gap.label, u.gap.assumed, "priced only once a prediction exists") for u in unknown]
    return Decision(facts.gpu_uuid, None, why, (), tuple(terms), tuple(missing), 0.0, e.horizon_days)

"""Each lifecycle option's expected cost over the horizon, with its parts: pure arithmetic.

Costs are what the option is expected to cost, over `horizon_days`, against the
GPU serving flawlessly for the horizon. With H the horizon in hours:

- m, the GPU's net value per hour in service: utilisation x the value of a
  GPU-hour of its work, less its power (W / 1000 x PUE x price), never below 0;
- p, the chance it fails within the horizon: 1 - (1 - p30)^(days / 30) (a
  constant hazard, as the predictor's p7); 1 for a GPU that has failed; p_in the
  part of it while the warranty runs, p_out the rest;
- a failure mid-job loses, with the chance a job runs (the utilisation), half
  a checkpoint interval plus a restart on every GPU of the job (training), or
  `inference_failure_h` (inference);
- a failed GPU goes back to the vendor: under warranty for shipping and a visit,
  out of it for those and the repair, or it is retired where that is cheaper
  (its remaining years of work lost); its slot stands empty for the turnaround,
  or for `spare_swap_h` while a spare is on hand.

The options:

- keep: p_in x (job loss + turnaround x m + shipping + visit) + p_out x (job
  loss + the cheaper of repair and retirement); a failed GPU kept loses H x m,
  and the repair a warranty ending inside the horizon would have covered;
- reset (reset / reseat and re-validate, only for a finding the action ladder
  says a reset or reseat addresses): a visit for a reseat, its downtime x m, a
  drain, then with the chance it clears the finding the GPU is as a healthy one
  (the predictor's baseline), else as it was;
- rma (warranty running) or repair (out of it): a drain, shipping and a visit,
  the turnaround x m, and what the vendor charges: with q the chance it finds a
  fault (1 for a failed GPU, else p; p also for one failed for what a reset or
  reseat addresses), (1 - q) x the no-fault-found fee, and for
  a repair q x the repair; back, the GPU is a healthy one for the rest;
- repurpose (training to inference): the drop in value per hour over H, a
  drain, and the failures of an inference GPU;
- retire: a drain and a visit, H x m, and the work of its remaining useful
  years (past the horizon) lost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from .settings import EconomicsSection

HOURS_PER_YEAR = 8766.0
WorkClass = Literal["training", "inference", "idle"]
# The scorer's actions (the action ladder) that a reset or a reseat addresses; a reseat needs a person.
RESET_FINDINGS = frozenset({"reset_gpu", "reboot_node", "run_diagnostics", "check_mechanicals"})
RESEAT_FINDINGS = frozenset({"check_mechanicals"})


class Option(StrEnum):
    KEEP = "keep"
    RESET = "reset"  # reset or reseat, and re-validate
    RMA = "rma"  # back to the vendor under warranty
    REPAIR = "repair"  # to the vendor (or a repairer) out of warranty
    REPURPOSE = "repurpose"  # from training to inference
    RETIRE = "retire"


@dataclass(frozen=True, slots=True)
class Situation:
    """Every input as a number (what was missing replaced by its assumed value)."""

    p30: float
    failed: bool
    finding: str | None
    utilisation: float
    power_w: float
    work: WorkClass
    job_gpus: int
    resets_30d: int
    warranty_days_left: float  # <= 0: ended (or unknown)
    rma_turnaround_days: float
    spares: bool
    purchase_price: float
    age_years: float


@dataclass(frozen=True, slots=True)
class OptionCost:
    option: Option
    expected_cost: float | None  # None: the option does not apply (`note` says why)
    parts: dict[str, float]
    note: str = ""


# --- the arithmetic -------------------------------------------------------------------------------


def horizon_probability(p30: float, days: float) -> float:
    """The chance of failing within `days`, from the chance within 30 (a constant hazard)."""
    survive: float = (1 - min(max(p30, 0.0), 1.0)) ** (max(days, 0.0) / 30)
    return 1 - survive


@dataclass(frozen=True, slots=True)
class _Prices:
    """The quantities every option shares, for one situation."""

    hours: float  # the horizon
    m: float  # net value per hour in service
    value: float  # value of a busy hour of its work
    job_loss: float  # one failure mid-job
    drain: float  # taking it out of service at a checkpoint
    down_in_h: float  # slot empty after a send-back under warranty
    down_out_h: float  # after a repair out of it
    repair: float
    remaining_work: float  # net value of its useful years past the horizon

    @classmethod
    def of(cls, s: Situation, e: EconomicsSection) -> _Prices:
        hours = e.horizon_days * 24
        value = e.inference_value_per_gpu_hour if s.work == "inference" else e.training_value_per_gpu_hour
        power = s.power_w / 1000 * e.pue * e.power_price_per_kwh
        m = max(s.utilisation * value - power, 0.0)
        if s.work == "training":
            job_loss = s.utilisation * s.job_gpus * (e.checkpoint_interval_h / 2 + e.job_restart_h) * value
            drain = s.utilisation * s.job_gpus * e.job_restart_h * value
        elif s.work == "inference":
            job_loss, drain = s.utilisation * e.inference_failure_h * value, 0.0
        else:
            job_loss = drain = 0.0
        swap = e.spare_swap_h if s.spares else None
        left_h = max(e.useful_life_years - s.age_years, 0.0) * HOURS_PER_YEAR
        return cls(
            hours=hours,
            m=m,
            value=value,
            job_loss=job_loss,
            drain=drain,
            down_in_h=swap if swap is not None else s.rma_turnaround_days * 24,
            down_out_h=swap if swap is not None else e.repair_turnaround_days * 24,
            repair=e.repair_cost_fraction * s.purchase_price,
            remaining_work=m * max(left_h - hours, 0.0),
        )


def _after_failure_out_of_warranty(
    x: _Prices, e: EconomicsSection, remaining_work: float, *, idle_h: float
) -> float:
    """The cheaper of repairing a GPU that failed out of warranty and retiring it (its slot empty for
    `idle_h` of the horizon)."""
    repair = x.repair + e.rma_shipping_cost + e.technician_visit_cost + x.down_out_h * x.m
    retire = e.technician_visit_cost + remaining_work + idle_h * x.m
    return min(repair, retire)


def keep_cost(
    s: Situation, e: EconomicsSection, hours: float | None = None, *, remaining_work: float | None = None
) -> tuple[float, dict[str, float]]:
    """Keeping the GPU in service as it is for `hours` (the horizon by default); `remaining_work`: the
    value of its useful years past the horizon, where that is not its value in its present role."""
    x = _Prices.of(s, e)
    hours = x.hours if hours is None else hours
    remaining = x.remaining_work if remaining_work is None else remaining_work
    if s.failed:
        # Waiting fixes nothing: the slot stands empty, and the fix is still due after (a repair where the
        # warranty ended meanwhile: what a warranty ending while it waits costs).
        if s.warranty_days_left * 24 > hours:
            fix = e.rma_shipping_cost + e.technician_visit_cost + x.down_in_h * x.m
        else:
            fix = _after_failure_out_of_warranty(x, e, remaining, idle_h=0.0)
        parts = {"idle_slot": hours * x.m, "fix_after_waiting": fix}
        return sum(parts.values()), parts
    p = horizon_probability(s.p30, hours / 24)
    p_in = horizon_probability(s.p30, min(max(s.warranty_days_left, 0.0), hours / 24))
    p_out = p - p_in
    parts = {
        "job_loss": p * x.job_loss,
        "downtime_under_warranty": p_in * x.down_in_h * x.m,
        "send_back_under_warranty": p_in * (e.rma_shipping_cost + e.technician_visit_cost),
        # a failure comes, on average, half-way through the horizon
        "failure_out_of_warranty": p_out * _after_failure_out_of_warranty(x, e, remaining, idle_h=hours / 2),
    }
    return sum(parts.values()), parts


def send_back_cost(s: Situation, e: EconomicsSection, baseline_p30: float, hours: float) -> OptionCost:
    """Sending the GPU to the vendor now: an RMA while the warranty runs, a repair after; `hours` is what is
    left of the horizon."""
    x = _Prices.of(s, e)
    under = s.warranty_days_left > 0
    # A GPU failed for a reason a reset or a reseat addresses may well have nothing wrong with it: the vendor
    # finds a fault with the chance it has a defect, as for one that serves
    q = 1.0 if s.failed and s.finding not in RESET_FINDINGS else horizon_probability(s.p30, hours / 24)
    down_h = x.down_in_h if under else x.down_out_h
    parts = {
        "drain": 0.0 if s.failed else x.drain,
        "shipping_and_visit": e.rma_shipping_cost + e.technician_visit_cost,
        "downtime": down_h * x.m,
        "no_fault_found": (1 - q) * e.no_fault_found_cost,
    }
    if not under:
        parts["repair"] = q * x.repair
    healthy = replace(s, p30=baseline_p30, failed=False, finding=None)
    parts["after_return"] = keep_cost(healthy, e, max(hours - down_h, 0.0))[0]
    option = Option.RMA if under else Option.REPAIR
    return OptionCost(option, sum(parts.values()), parts, f"the vendor finds a fault with p={q:.3g}")


def price_options(s: Situation, e: EconomicsSection, baseline_p30: float) -> list[OptionCost]:
    """Every option's expected cost over the horizon, with its parts (or why it does not apply); cheapest
    first, keep first on a tie for a GPU that serves and last for one that cannot."""
    x = _Prices.of(s, e)
    healthy = replace(s, p30=baseline_p30, failed=False, finding=None)
    drain = 0.0 if s.failed else x.drain
    keep, keep_parts = keep_cost(s, e)
    sent = send_back_cost(s, e, baseline_p30, x.hours)
    out = [OptionCost(Option.KEEP, keep, keep_parts), sent]
    other = Option.REPAIR if sent.option is Option.RMA else Option.RMA
    out.append(
        OptionCost(other, None, {}, "under warranty" if other is Option.REPAIR else "the warranty has ended")
    )

    if s.finding in RESET_FINDINGS:
        # A reseat is another remedy than the resets before it (the ladder climbed past them): it gets the
        # first try's chance; a reset after resets that did not hold, less (repeats escalate in the scorer)
        fresh = s.resets_30d == 0 or s.finding in RESEAT_FINDINGS
        fix = e.reset_fix_probability if fresh else e.reset_fix_probability_after_reset
        rest = max(x.hours - e.reset_downtime_h, 0.0)
        # not cleared, the next decision keeps it or sends it back, whichever is cheaper then
        then = min(keep_cost(s, e, rest)[0], send_back_cost(s, e, baseline_p30, rest).expected_cost or 0.0)
        parts = {
            "visit": e.technician_visit_cost if s.finding in RESEAT_FINDINGS else 0.0,
            "drain": drain,
            "downtime": e.reset_downtime_h * x.m,
            "after_if_cleared": fix * keep_cost(healthy, e, rest)[0],
            "after_if_not": (1 - fix) * then,
        }
        out.append(OptionCost(Option.RESET, sum(parts.values()), parts, f"clears the finding with p={fix:g}"))
    else:
        out.append(
            OptionCost(Option.RESET, None, {}, f"no finding a reset or reseat addresses ({s.finding})")
        )

    if s.work == "training" and not s.failed:
        inference = replace(s, work="inference", utilisation=e.repurposed_utilisation)
        y = _Prices.of(inference, e)
        parts = {
            "value_lost": x.hours * max(x.m - y.m, 0.0),
            "drain": drain,
            # it could go back to training: what its remaining years are worth stays what they are
            "failures_in_inference": keep_cost(inference, e, remaining_work=x.remaining_work)[0],
        }
        out.append(OptionCost(Option.REPURPOSE, sum(parts.values()), parts))
    else:
        why = "it cannot serve now" if s.failed else f"its work is {s.work}, not training"
        out.append(OptionCost(Option.REPURPOSE, None, {}, why))

    parts = {
        "drain": drain,
        "visit": e.technician_visit_cost,
        "idle_slot": x.hours * x.m,
        "remaining_years_lost": x.remaining_work,
    }
    out.append(OptionCost(Option.RETIRE, sum(parts.values()), parts))
    order = list(Option)
    if s.failed:  # a GPU that cannot serve: on a tie, act
        order = [*order[1:], Option.KEEP]
    return sorted(out, key=lambda o: (o.expected_cost is None, o.expected_cost or 0.0, order.index(o.option)))


def cheapest(options: list[OptionCost]) -> OptionCost:
    return options[0]  # price_options sorts them, keep first on a tie

"""One policy living through one simulated fleet's year (evaluation/lifecycle_world.py), and what it cost.

Every policy gets the same help: the remediator resets a GPU after each
job-crashing XID and each stuck fault, and a GPU sent back goes out with a
spare in its slot while one is on hand. They differ in what they do besides:

- `run_to_failure`: nothing before a GPU fails; a GPU still stuck after its
  reset is reseated once, then sent back; a dead GPU is sent back (retired
  instead once past its useful life, where a repair would buy nothing);
- `first_hard_error`: a GPU is sent back at its first hard error (a
  job-crashing XID, a stuck fault, a failure), as some operators do;
- `engine`: services.lifecycle's `decide` for every GPU in service each day,
  and for a GPU the moment it sticks or dies, on what the service would see:
  the real predictor's score from the day's precursors through the
  calibration it is given, the remediator's resets, the inventory, the
  workload; its choice is carried out.

After `Shape.days`, every policy runs to failure for `tail_days`, so a defect
left in the fleet at the end is paid for. The ledger is money lost against a
fleet that never fails: work lost by jobs, hours out of service at the GPU's
net value, drains, visits, shipping, repairs and no-fault fees, value given
up by repurposing, and the useful years written off by retiring.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from services.lifecycle.calibration import Calibration
from services.lifecycle.costs import HOURS_PER_YEAR, Option
from services.lifecycle.decide import GpuFacts, decide
from services.lifecycle.inventory import InventoryEntry
from services.lifecycle.settings import EconomicsSection
from services.scorer.predict import predict_one
from services.scorer.rules_config import PredictorWeights

from .lifecycle_world import (
    RESEAT_CLEARS_STUCK,
    RESET_CLEARS_STUCK,
    Incarnation,
    Shape,
    Slot,
    fleet,
    incarnation,
)

Policy = Literal["run_to_failure", "first_hard_error", "engine"]
POLICIES: tuple[Policy, ...] = ("engine", "run_to_failure", "first_hard_error")
# What the predictor says of a day's precursors: p(fail within 30 days).
Predictor = Callable[[dict[str, float]], float]


def committed_predictor(weights: PredictorWeights) -> Predictor:
    """The predictor as deployed: config/predictor-weights.toml through services.scorer.predict."""
    return lambda seen: predict_one("GPU-simulated", seen, weights).p_fail_30d


@dataclass(slots=True)
class Ledger:
    cost: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # money, by what on
    count: Counter[str] = field(default_factory=Counter)  # what happened
    # (the predictor's score, failed within 30 days) of GPUs in service, every `sample_every_days`
    calibration: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.cost.values())


@dataclass(slots=True)
class Place:
    slot: Slot
    gpu: Incarnation
    n: int = 0
    state: str = "serving"  # serving, stuck, dead, away, retired
    back_at: float = 0.0
    returning: Incarnation | None = None  # what comes back when `away` ends (None: a new GPU)
    work: str = ""
    utilisation: float = 0.0
    job_gpus: int = 1
    resets: list[float] = field(default_factory=list)
    done: set[float] = field(default_factory=set)  # events of this GPU already lived through


class Simulation:
    def __init__(
        self,
        seed: int,
        policy: Policy,
        shape: Shape,
        econ: EconomicsSection,
        predictor: Predictor,
        baseline: float,
        *,
        calibration: Calibration | None,
        predicts: bool = True,
        sample_every_days: int = 7,
    ) -> None:
        """`baseline`: a healthy GPU's p30 as the engine prices it; `calibration`: the engine's (None: the
        score taken as the probability); `predicts`: False, the engine gets no prediction at all (it can
        then act only on GPUs that stuck or died)."""
        self.seed, self.policy, self.shape, self.e, self.predictor, self.baseline = (
            seed,
            policy,
            shape,
            econ,
            predictor,
            baseline,
        )
        self.calibration, self.predicts, self.sample_every_days = calibration, predicts, sample_every_days
        self.end = shape.days + shape.tail_days
        self.ledger = Ledger()
        self.places = [self._place(s) for s in fleet(seed, shape)]
        self.spares_back: list[float] = []  # when each spare in use comes back to the shelf

    def _place(self, s: Slot) -> Place:
        gpu = incarnation(
            self.seed, s.index, 0, installed=0.0, age_years=s.age_years(self.shape, 0), shape=self.shape
        )
        return Place(slot=s, gpu=gpu, work=s.work, utilisation=s.utilisation, job_gpus=s.job_gpus)

    # --- money -----------------------------------------------------------------------------------
    def value(self, p: Place) -> float:
        return (
            self.e.inference_value_per_gpu_hour
            if p.work == "inference"
            else self.e.training_value_per_gpu_hour
        )

    def m(self, p: Place) -> float:
        power = (100 + 600 * p.utilisation) / 1000 * self.e.pue * self.e.power_price_per_kwh
        return max(p.utilisation * self.value(p) - power, 0.0)

    def m0(self, p: Place) -> float:
        """Its net value per hour in the role it was bought for."""
        s = p.slot
        power = s.power_w / 1000 * self.e.pue * self.e.power_price_per_kwh
        value = (
            self.e.inference_value_per_gpu_hour
            if s.work == "inference"
            else self.e.training_value_per_gpu_hour
        )
        return max(s.utilisation * value - power, 0.0)

    def job_crash(self, p: Place, at: float) -> None:
        draw = p.gpu.draw("job", at)
        if draw.random() >= p.utilisation:
            return  # no job on it then
        if p.work == "training":
            lost = p.job_gpus * (draw.uniform(0, self.e.checkpoint_interval_h) + self.e.job_restart_h)
        else:
            lost = self.e.inference_failure_h if p.work == "inference" else 0.0
        self.ledger.cost["job_loss"] += lost * self.value(p)
        self.ledger.count["job_crashes"] += 1

    def drain(self, p: Place) -> None:
        if p.state == "serving" and p.work == "training":
            self.ledger.cost["drain"] += p.utilisation * p.job_gpus * self.e.job_restart_h * self.value(p)

    def out(self, p: Place, hours: float) -> None:
        self.ledger.cost["downtime"] += hours * self.m(p)

    # --- what can be done to a GPU ---------------------------------------------------------------
    def reset(self, p: Place, at: float, *, reseat: bool) -> None:
        """A reset (the remediator's) or a reseat (a technician's); a stuck GPU may come back."""
        self.out(p, self.e.reset_downtime_h)
        p.resets.append(at)
        self.ledger.count["reseats" if reseat else "resets"] += 1
        if reseat:
            self.ledger.cost["visits"] += self.e.technician_visit_cost
        clears = RESEAT_CLEARS_STUCK if reseat else RESET_CLEARS_STUCK
        if p.state == "stuck" and p.gpu.draw("reseat" if reseat else "reset", at).random() < clears:
            p.state = "serving"

    def send_back(self, p: Place, at: float) -> None:
        s, gpu = p.slot, p.gpu
        self.drain(p)
        under = s.warranty_days_left(self.shape, at) > 0
        self.ledger.cost["shipping_and_visits"] += self.e.rma_shipping_cost + self.e.technician_visit_cost
        self.ledger.count["sent_back"] += 1
        found = gpu.defective(at)
        if found:
            self.ledger.count["sent_failed" if at >= gpu.death else "sent_would_fail"] += 1
            if not under:
                self.ledger.cost["repairs"] += self.e.repair_cost_fraction * s.price
                self._missed(p, at)
        else:
            self.ledger.count["sent_no_fault"] += 1
            self.ledger.cost["no_fault_found"] += self.e.no_fault_found_cost
        turnaround = (s.turnaround_days if under else self.e.repair_turnaround_days) * 24
        while self.spares_back and self.spares_back[0] <= at:
            heapq.heappop(self.spares_back)
        if (
            len(self.spares_back) < self.shape.spares
        ):  # a spare takes the slot; the GPU goes to the shelf after
            heapq.heappush(self.spares_back, at + turnaround / 24)
            self.out(p, self.e.spare_swap_h)
            self._install(p, at + self.e.spare_swap_h / 24, None)
        else:
            self.out(p, turnaround)
            self._install(p, at + turnaround / 24, None if found else gpu)

    def _install(self, p: Place, at: float, same: Incarnation | None) -> None:
        """The slot serves again at `at`: the same GPU (no fault found) or a new one."""
        p.state, p.back_at = "away", at
        if same is None:
            p.n += 1
            p.returning = incarnation(
                self.seed, p.slot.index, p.n, installed=at, age_years=0.0, shape=self.shape
            )
        else:
            p.returning = same

    def retire(self, p: Place, at: float) -> None:
        self.drain(p)
        self.ledger.cost["visits"] += self.e.technician_visit_cost
        self.ledger.count["retired"] += 1
        if p.gpu.defective(at):
            self._missed(p, at)
        left_h = max(self.e.useful_life_years - p.slot.age_years(self.shape, self.end), 0.0) * HOURS_PER_YEAR
        self.ledger.cost["downtime"] += (self.end - at) * 24 * self.m0(p)
        self.ledger.cost["write_off"] += left_h * self.m0(p)
        p.state = "retired"

    def repurpose(self, p: Place, at: float) -> None:
        self.drain(p)
        self.ledger.count["repurposed"] += 1
        p.work, p.job_gpus = "inference", 1
        p.utilisation = p.gpu.draw("inference", at).uniform(0.4, 0.6)

    def _missed(self, p: Place, at: float) -> None:
        """A defect paid for out of warranty that showed itself while the warranty ran."""
        g = p.gpu
        if g.wear and g.onset < p.slot.warranty_days_left(self.shape, 0):
            self.ledger.count["missed_under_warranty"] += 1

    # --- the policies ----------------------------------------------------------------------------
    def acting(self, day: float) -> Policy:
        return self.policy if day < self.shape.days else "run_to_failure"

    def after_failure(self, p: Place, at: float) -> None:
        """A GPU stuck after its reset, or dead: what the policy does at once."""
        policy = self.acting(at)
        if policy == "engine":
            self.apply(p, at, self.decision(p, at))
        elif policy == "first_hard_error":
            self.send_back(p, at)
        elif p.state == "stuck":
            self.reset(p, at, reseat=True)
            if p.state == "stuck":
                self.send_back(p, at)
        elif (
            p.slot.age_years(self.shape, at) >= self.e.useful_life_years
            and p.slot.warranty_days_left(self.shape, at) <= 0
        ):
            self.retire(p, at)
        else:
            self.send_back(p, at)

    def decision(self, p: Place, at: float) -> Option | None:
        s, day = p.slot, int(at)
        failed = p.state in ("stuck", "dead")
        p30 = None if p.state == "dead" or not self.predicts else self.predictor(p.gpu.observed(day))
        while self.spares_back and self.spares_back[0] <= at:
            heapq.heappop(self.spares_back)
        inv = InventoryEntry(
            line=1,
            serial=None,
            gpu_uuid="GPU-simulated",
            purchase_date=s.purchase,
            purchase_price=s.price,
            warranty_end=s.warranty_end,
            rma_turnaround_days=s.turnaround_days,
            spares_on_hand=self.shape.spares - len(self.spares_back),
        )
        facts = GpuFacts(
            "GPU-simulated",
            p_fail_30d=p30,
            failed=failed,
            finding={"stuck": "check_mechanicals", "dead": "send_for_repair"}.get(p.state),
            utilisation=p.utilisation,
            power_w=100 + 600 * p.utilisation,
            work=p.work,  # type: ignore[arg-type]
            job_gpus=p.job_gpus,
            resets_30d=sum(at - 30 < r <= at for r in p.resets),
            inventory=inv,
        )
        today = self.shape.start + timedelta(days=day)
        return decide(
            facts, self.e, baseline_p30=self.baseline, today=today, calibration=self.calibration
        ).choice

    def apply(self, p: Place, at: float, choice: Option | None) -> None:
        if choice in (Option.RMA, Option.REPAIR):
            self.send_back(p, at)
        elif choice is Option.RESET:
            self.reset(p, at, reseat=p.state == "stuck")
        elif choice is Option.RETIRE:
            self.retire(p, at)
        elif choice is Option.REPURPOSE:
            self.repurpose(p, at)

    # --- the year --------------------------------------------------------------------------------
    def run(self) -> Ledger:
        for day in range(self.end):
            for p in self.places:
                self.live_day(p, day)
        return self.ledger

    def live_day(self, p: Place, day: int) -> None:
        if p.state == "away" and p.back_at < day + 1:
            assert p.returning is not None
            if p.returning is not p.gpu:  # a new GPU takes the slot's own work again
                p.work, p.utilisation, p.job_gpus = p.slot.work, p.slot.utilisation, p.slot.job_gpus
            p.gpu, p.returning, p.state = p.returning, None, "serving"
        if p.state == "retired" or p.state == "away":
            return
        if p.state in ("stuck", "dead"):  # left so by the engine yesterday: idle, and decided again
            self.out(p, 24)
            if self.acting(day) == "engine":
                self.apply(p, day, self.decision(p, day))
            else:
                self.after_failure(p, day)
            return
        self.ledger.cost["value_given_up"] += 24 * max(self.m0(p) - self.m(p), 0.0)
        if (
            day % self.sample_every_days == 0 and day < self.shape.days
        ):  # what the predictor says of GPUs in service, and the truth
            self.ledger.calibration.append((self.predictor(p.gpu.observed(day)), p.gpu.death - day <= 30))
        if self.acting(day) == "engine" and self.predicts:  # with no prediction a serving GPU is left open
            self.apply(p, day, self.decision(p, day))
            if p.state != "serving":
                return
        g = p.gpu
        events = sorted(
            [(t, "xid") for t in g.xids if day <= t < day + 1]
            + [(t, "stuck") for t in g.stuck if day <= t < day + 1]
            + ([(g.death, "death")] if day <= g.death < day + 1 else [])
        )
        for at, what in events:
            if p.state != "serving":
                break
            if at < p.back_at:  # it was away then
                continue
            self.job_crash(p, at)
            if what == "death":
                self.ledger.count["failures"] += 1
                p.state = "dead"
                self.after_failure(p, at)
            elif self.acting(at) == "first_hard_error":
                self.ledger.count["hard_errors"] += 1
                self.send_back(p, at)
            else:
                self.ledger.count["hard_errors"] += 1
                if what == "stuck":
                    p.state = "stuck"
                self.reset(p, at, reseat=False)
                if p.state == "stuck":
                    self.after_failure(p, at)

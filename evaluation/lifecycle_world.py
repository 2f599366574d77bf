"""A simulated fleet's year, with its ground truth: who buys what when, which GPUs wear out, fail, or stick.

Each slot of the fleet holds one GPU at a time (an *incarnation*): the one
bought with the slot, then whatever replaced it (a spare, an RMA's
replacement). Every incarnation's fate is drawn from its own random stream
(seed, slot, incarnation), so two policies facing the same fleet see the same
GPUs do the same things until a policy replaces one.

The truth, per incarnation:

- a defect starts at a hazard that doubles once the GPU is past its warranty
  age (`WEAR_OUT_YEARS`): 70 % wear out, showing precursors (one of corrected
  memory errors growing, rows remapped, PCIe replays growing, heat the load
  does not explain) that grow over a lead of 7 to 45 days and then fail for
  good, with a few job-crashing XIDs along the way; 30 % fail at once, with no
  sign before;
- a GPU with no defect may still stick (fall off the bus, a hung state): a
  reset clears that 70 % of the time, a reseat 90 %; the vendor finds no fault;
- what the predictor sees each day is the defect's precursor with noise, a
  day in five nothing at all, and on healthy GPUs the odd benign episode (a
  few days of heat drift or corrected errors that lead nowhere).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import date, timedelta

WEAR_OUT_YEARS = 3.0
DEFECTS_PER_YEAR = 0.06  # before WEAR_OUT_YEARS; twice that after
STUCK_PER_YEAR = 0.06
WEAR_SHARE = 0.7
RESET_CLEARS_STUCK = 0.7
RESEAT_CLEARS_STUCK = 0.9
BENIGN_PER_DAY = 0.004
BLIND_DAY = 0.2  # the share of days the predictor's window shows a wearing GPU nothing
CHANNELS = {  # precursor -> the range of its value at the end of the lead
    "sbe_growth_per_hour": (0.5, 3.0),
    "memory_rows_per_day": (0.5, 4.0),
    "pcie_growth_per_hour": (0.5, 3.0),
    "heat_unexplained_c": (1.0, 5.0),
}
BENIGN = {"heat_unexplained_c": (0.2, 1.5), "sbe_growth_per_hour": (0.05, 0.5)}


@dataclass(frozen=True, slots=True)
class Shape:
    gpus: int = 256
    days: int = 365  # the policy decides for these
    tail_days: int = 60  # then every policy runs to failure, so a defect left at the end is paid for
    spares: int = 5
    start: date = date(2026, 1, 1)


@dataclass(slots=True)
class Incarnation:
    """One GPU's fate (days are days since the simulation's start)."""

    key: str  # (seed, slot, incarnation): what every draw about this GPU is seeded by
    onset: float = math.inf  # the defect's start
    death: float = math.inf  # when it fails for good
    wear: bool = False  # precursors before the death (else a sudden failure)
    channel: str = ""
    gain: float = 0.0
    xids: list[float] = field(default_factory=list)  # job-crashing XIDs of a wearing GPU (it goes on)
    stuck: list[float] = field(default_factory=list)  # stuck faults of a GPU with no defect
    benign: list[tuple[float, float, str, float]] = field(default_factory=list)

    def draw(self, what: str, at: float) -> random.Random:
        """A stream of its own for one happening (a job running at a fault, a reset clearing it): the same
        happening draws the same whatever the policy did elsewhere."""
        return random.Random(f"{self.key}:{what}:{at:.6f}")  # noqa: S311 - reproducible, not secret

    def defective(self, day: float) -> bool:
        return day >= self.onset

    def observed(self, day: int) -> dict[str, float]:
        """The predictor's inputs as its window shows them on `day` (raw values)."""
        noise = self.draw("seen", day)
        seen: dict[str, float] = {}
        if self.wear and self.onset <= day < self.death and noise.random() >= BLIND_DAY:
            f = ((day - self.onset) / (self.death - self.onset)) ** 1.5
            seen[self.channel] = f * self.gain * math.exp(noise.gauss(0, 0.3))
        for start, end, channel, value in self.benign:
            if start <= day < end:
                seen[channel] = max(seen.get(channel, 0.0), value)
        return seen


def incarnation(
    seed: int, slot: int, n: int, *, installed: float, age_years: float, shape: Shape
) -> Incarnation:
    """The fate of the `n`th GPU in `slot`, installed on day `installed`, `age_years` old then."""
    key = f"lifecycle:{seed}:{slot}:{n}"
    rng = random.Random(key)  # noqa: S311 - reproducible, not secret
    end = shape.days + shape.tail_days
    g = Incarnation(key=key)
    # the defect's start: a piecewise-constant hazard, doubled past the wear-out age
    young_days = max((WEAR_OUT_YEARS - age_years) * 365.25, 0.0)
    t = installed + rng.expovariate(DEFECTS_PER_YEAR / 365.25)
    if t - installed > young_days:
        t = installed + young_days + rng.expovariate(2 * DEFECTS_PER_YEAR / 365.25)
    if t < end:
        g.onset = t
        g.wear = rng.random() < WEAR_SHARE
        if g.wear:
            lead = rng.uniform(7, 45)
            g.death = t + lead
            g.channel = rng.choice(sorted(CHANNELS))
            g.gain = rng.uniform(*CHANNELS[g.channel])
            k = t + rng.expovariate(1 / 20)
            while k < g.death:
                if rng.random() < (k - t) / lead:  # more often as it wears
                    g.xids.append(k)
                k += rng.expovariate(1 / 8)
        else:
            g.death = t
    t = installed + rng.expovariate(STUCK_PER_YEAR / 365.25)
    while t < min(end, g.onset):
        g.stuck.append(t)
        t += rng.expovariate(STUCK_PER_YEAR / 365.25)
    day = installed + rng.expovariate(BENIGN_PER_DAY)
    while day < end:
        channel = rng.choice(sorted(BENIGN))
        g.benign.append((day, day + rng.uniform(1, 4), channel, rng.uniform(*BENIGN[channel])))
        day += rng.expovariate(BENIGN_PER_DAY)
    return g


@dataclass(slots=True)
class Slot:
    """A place in the fleet: what it was bought as and what runs on it (the inventory and the workload)."""

    index: int
    purchase: date
    price: float
    warranty_end: date
    turnaround_days: int
    work: str  # training, inference or idle
    utilisation: float
    job_gpus: int
    power_w: float

    def warranty_days_left(self, shape: Shape, day: float) -> float:
        return (self.warranty_end - shape.start).days - day

    def age_years(self, shape: Shape, day: float) -> float:
        return ((shape.start - self.purchase).days + day) / 365.25


def fleet(seed: int, shape: Shape) -> list[Slot]:
    """The slots of one seed's fleet: bought over the last 3.8 years (none past five by the end), three years
    of warranty each."""
    rng = random.Random(f"lifecycle-fleet:{seed}")  # noqa: S311 - reproducible, not secret
    slots = []
    for i in range(shape.gpus):
        bought = shape.start - timedelta(days=rng.randint(0, int(3.8 * 365)))
        new = (shape.start - bought).days < 2.5 * 365
        work = rng.choices(["training", "inference", "idle"], weights=[70, 20, 10])[0]
        util = {
            "training": rng.uniform(0.75, 0.95),
            "inference": rng.uniform(0.3, 0.7),
            "idle": rng.uniform(0.0, 0.05),
        }[work]
        slots.append(
            Slot(
                index=i,
                purchase=bought,
                price=30_000.0 if new else 15_000.0,
                warranty_end=bought + timedelta(days=3 * 365),
                turnaround_days=rng.choice([14, 21, 28]),
                work=work,
                utilisation=util,
                job_gpus=rng.choice([8, 16, 64, 256]) if work == "training" else 1,
                power_w=100 + 600 * util,
            )
        )
    return slots

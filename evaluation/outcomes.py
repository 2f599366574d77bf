"""`python -m evaluation.outcomes` (`make evaluate`): the remediator's decisions scored against what happened.

Each seed's simulated week (evaluation/outcome_world.py: reset-fixable,
reboot-fixable, persistent, flaky, job and place faults) runs four ways on the
same faults:

- `remediator`: the real scorer judges the fleet every simulated minute, after
  each minute's poll, and the real remediator runs live on the
  simulation's clock, through a scheduler standing in (`SimScheduler`) and the
  mock fleet's own reset, reboot and compute check (`SimNodeExec`), with the
  committed policy (the breaker's and the cap's shares opened to the small fleet, as in
  evaluation/remediation.py). A person (`Person`: within 4 working hours)
  approves what waits for approval, and repairs a node left out for a person
  and marks its GPUs repaired (the remediator then validates it and returns it);
- `loop open`: the same, but no remedy resolves anything (the remediator's
  `gpu_remedies` rows are taken away after each look): the remediator as it
  was before #40;
- `cordon-and-wait`: each fault's node cordoned as soon as the remediator
  cordons (its median delay in the `remediator` run), then a person, who
  drains, remedies what the ground truth says and returns the node;
- `no automation`: a person, paged by the alert (2 minutes after the fault),
  acts within 4 working hours: drains, remedies and returns.

The two baselines replay their person's remedies on a fresh mock fleet of the
same seed and faults (`replay`), so flaky faults come back by the mock's own
draws. A person's remedy takes 10 minutes (a reset), 15 (a reboot) or 2 hours
(a repair). evaluation/outcome_metrics.py turns each run into the figures per
class; `render` prints them with the targets.

Simulated time goes minute by minute from each fault, each remedy and each
visit for 10 minutes, and while a plan runs; in between, one poll and one
cycle every 30 simulated minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from services.lifecycle.settings import EconomicsSection
from services.remediator.policy import Policy, load_policy
from services.scorer.rules_config import DEFAULT_RULES, Rules, load_rules
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings, Settings

from .outcome_arm import Arm, cordon_delay, replay
from .outcome_metrics import ClassFigures, Timeline, figures, node_hours, remedy_outcomes
from .outcome_world import (
    CLASSES,
    OutcomeScenario,
    monday_before,
    outcome_scenario,
)

log = logging.getLogger(__name__)

SEEDS = (301,)
ARMS = ("remediator", "loop open", "cordon-and-wait", "no automation")
# what the lifecycle engine assumes of a reset (EconomicsSection), as the remediator's runs measure it
REMEDY_FIGURES = ("reset_fix_probability", "reset_fix_probability_after_reset", "reset_downtime_h")


@dataclass(slots=True)
class ArmResult:
    arm: str
    seed: int
    figures: dict[str, ClassFigures]
    node_hours: float
    wall_s: float
    remedies: dict[str, float]  # what the lifecycle engine assumes of a reset, as this run saw it
    timeline: Timeline | None = None  # what happened (--json keeps it, to see why a figure is what it is)


@contextmanager
def _arm(db: DatabaseSettings, oscen: OutcomeScenario, seed: int, rules: Rules, *, loop_closed: bool,
         start_s: float, policy: Policy | None = None) -> Iterator[Arm]:  # fmt: skip
    with migrated_schema(db, "outcomes") as scoped:
        arm = Arm(scoped, oscen, seed, rules, loop_closed=loop_closed, start_s=start_s, policy=policy)
        try:
            yield arm
        finally:
            arm.close()


def run_seed(
    db: DatabaseSettings,
    seed: int,
    rules: Rules,
    *,
    days: float = 7.0,
    arms: tuple[str, ...] = ARMS,
    policy: Policy | None = None,
) -> list[ArmResult]:
    """The arms asked for on one seed's week, the simulated ones each in a throwaway schema (cordon-and-wait
    follows the remediator's cordons: it needs that arm)."""
    oscen = outcome_scenario(seed, days=days)
    start_s = monday_before(time.time() - oscen.scenario.hours * 3600 - 7 * 86400) + 17.5
    results: list[ArmResult] = []
    timelines: dict[str, Timeline] = {}
    for name, closed in (("remediator", True), ("loop open", False)):
        if name not in arms and not (name == "remediator" and "cordon-and-wait" in arms):
            continue
        began = time.perf_counter()
        with _arm(db, oscen, seed, rules, loop_closed=closed, start_s=start_s, policy=policy) as arm:
            timelines[name] = arm.run(oscen.scenario.hours)
        results.append(ArmResult(name, seed, figures(timelines[name], CLASSES), node_hours(timelines[name]),
                                 time.perf_counter() - began, remedy_outcomes(timelines[name]),
                                 timelines[name]))  # fmt: skip
    for name in ("cordon-and-wait", "no automation"):
        if name not in arms:
            continue
        began = time.perf_counter()
        delay = cordon_delay(timelines["remediator"]) if name == "cordon-and-wait" else None
        timelines[name] = replay(name, oscen, seed, start_s, cordon_after_s=delay)
        results.append(ArmResult(name, seed, figures(timelines[name], CLASSES), node_hours(timelines[name]),
                                 time.perf_counter() - began, remedy_outcomes(timelines[name]),
                                 timelines[name]))  # fmt: skip
    return results


def load_results(path: Path) -> list[ArmResult]:
    """Results written by --json (of runs split over processes: --arms)."""
    return [
        ArmResult(
            r["arm"],
            r["seed"],
            {c: ClassFigures(**x) for c, x in r["figures"].items()},
            r["node_hours"],
            r["wall_s"],
            r["remedies"],
        )
        for r in json.loads(path.read_text())
    ]


def merged(results: list[ArmResult]) -> dict[str, tuple[dict[str, ClassFigures], float]]:
    """Per arm, its figures over every seed (class by class) and its node-hours."""
    out: dict[str, tuple[dict[str, ClassFigures], float]] = {}
    for r in results:
        mine, hours = out.get(r.arm, ({}, 0.0))
        for cls, x in r.figures.items():
            into = mine.setdefault(cls, ClassFigures())
            for name in ("faults", "automatic", "within_15min", "never_back", "faulty_returns", "healthy_out",
                         "pods", "jobs", "people"):  # fmt: skip
                setattr(into, name, getattr(into, name) + getattr(x, name))
            into.out_s += x.out_s
        out[r.arm] = (mine, hours + r.node_hours)
    return out


def _min(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f} min" if x < 120 else f"{x / 60:.1f} h"


def targets(by_arm: dict[str, tuple[dict[str, ClassFigures], float]]) -> dict[str, bool]:
    mine, hours = by_arm["remediator"]
    reset = mine["reset"]
    return {
        ">= 95 % of reset-fixable faults back in service automatically within 15 min":
            reset.faults > 0 and reset.within_15min >= 0.95 * reset.faults,
        "0 nodes returned with their fault still there": sum(x.faulty_returns for x in mine.values()) == 0,
        "node-hours out of service <= 25 % of no automation's": hours <= 0.25 * by_arm["no automation"][1],
    }  # fmt: skip


def render(results: list[ArmResult]) -> str:
    by_arm = merged(results)
    seeds = sorted({r.seed for r in results})
    lines = [
        f"the remediator's decisions against what happened: seeds {seeds}, 8 nodes x 2 GPUs each",
        "per class: faults, back in service automatically (within 15 min), never back in the run,",
        "median / p95 time out of service, nodes returned still faulty, healthy nodes taken out,",
        "pods evicted and jobs disrupted per fault, a person needed",
        f"  {'arm':<16}{'class':<11}{'faults':>7}{'auto':>6}{'<=15m':>7}{'never':>6}{'median':>9}{'p95':>9}"
        f"{'faulty':>7}{'healthy':>8}{'pods/f':>7}{'jobs/f':>7}{'person':>7}",
    ]
    for arm in ARMS:
        mine, _ = by_arm[arm]
        for cls in [*CLASSES, "none"]:
            x = mine.get(cls)
            if x is None or not (x.faults or x.healthy_out or x.people or x.pods):
                continue
            per = max(x.faults, 1)
            lines.append(
                f"  {arm:<16}{cls:<11}{x.faults:>7}{x.automatic:>6}{x.within_15min:>7}{x.never_back:>6}"
                f"{_min(x.median_min):>9}{_min(x.p95_min):>9}{x.faulty_returns:>7}{x.healthy_out:>8}"
                f"{x.pods / per:>7.1f}{x.jobs / per:>7.1f}{x.people:>7}"
            )
    base = by_arm["no automation"][1]
    lines.append("\nnode-hours out of service (cordoned, or with an active fault), against no automation's:")
    for arm in ARMS:
        hours = by_arm[arm][1]
        lines.append(f"  {arm:<16}{hours:>9.1f} h{hours / base if base else 0:>8.0%}")
    for name, ok in targets(by_arm).items():
        lines.append(f"  [{'ok' if ok else 'MISSED'}] {name}")
    seen = seen_remedies(results)
    lines.append(
        "\nwhat the lifecycle engine reads of a reset, as the remediator's runs saw it (its defaults):"
    )
    defaults = EconomicsSection()
    for name in REMEDY_FIGURES:
        value, default = seen.get(name), getattr(defaults, name)
        lines.append(f"  {name:<36}{'-' if value is None else f'{value:.3f}':>8}   ({default})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.outcomes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--days", type=float, default=7.0, help="simulated days per seed (at least 2)")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    parser.add_argument("--policy", type=Path, help="the remediator's policy (default: the committed one)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="run only these arms")
    parser.add_argument("--render", type=Path, nargs="+", help="print the results of earlier --json runs")
    parser.add_argument(
        "--remedy-outcomes", type=Path,
        help="write what the remediator's resets did (for python -m evaluation.lifecycle --remedy-outcomes)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.days < 2:
        parser.error("--days must be at least 2")
    if args.render:
        results = [r for path in args.render for r in load_results(path)]
    else:
        rules, db = load_rules(args.rules), Settings().db
        arms, policy = tuple(args.arms), load_policy(args.policy) if args.policy else None
        results = [r for seed in args.seeds
                   for r in run_seed(db, seed, rules, days=args.days, arms=arms, policy=policy)]  # fmt: skip
    if {r.arm for r in results} >= set(ARMS):
        print(render(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.remedy_outcomes:
        args.remedy_outcomes.write_text(json.dumps(seen_remedies(results), indent=1))
    return 0


def seen_remedies(results: list[ArmResult]) -> dict[str, float]:
    """The remediator's runs' remedy outcomes, each figure the mean over the seeds that measured it."""
    out: dict[str, list[float]] = {}
    for r in results:
        if r.arm == "remediator":
            for name, value in r.remedies.items():
                out.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in out.items()}


if __name__ == "__main__":
    sys.exit(main())

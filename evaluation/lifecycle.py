"""`python -m evaluation.lifecycle` (and `make evaluate`): does following the lifecycle engine save money?

Simulated fleets (evaluation/lifecycle_world.py: GPUs bought over four and a
half years with three-year warranties, training, inference and idle work,
defects that wear out with precursors or fail at once, GPUs that stick) live
a year under each policy (evaluation/lifecycle_sim.py): the engine
(services.lifecycle's decisions on the real predictor's p(fail)), running
every GPU to failure, and sending a GPU back at its first hard error. Each
seed is one fleet, the same for the three. The report gives each policy's
total cost per seed, the engine's saving against each baseline with its
spread over seeds, how many GPUs each sent back had failed or would have, how
many came back with no fault found, and how many defects that showed while the
warranty ran were paid for after it ended. A saving that is not there is
reported as such.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from services.lifecycle.settings import EconomicsSection
from services.scorer.rules_config import load_rules

from .lifecycle_sim import Ledger, Simulation, committed_predictor, recalibrated
from .lifecycle_world import Shape

SEEDS = tuple(range(201, 207))
TRAIN_SEEDS = (101, 102, 103)  # the recalibration's fleets: never evaluated on
COUNTS = (
    "sent_back",
    "sent_failed",
    "sent_would_fail",
    "sent_no_fault",
    "missed_under_warranty",
    "failures",
    "retired",
    "repurposed",
    "reseats",
)
# The rows: (name, policy, which predictor the engine reads)
RUNS = (
    ("engine", "engine", "committed"),
    ("engine, recalibrated", "engine", "recalibrated"),
    ("run_to_failure", "run_to_failure", "committed"),
    ("first_hard_error", "first_hard_error", "committed"),
)
BASELINES = ("run_to_failure", "first_hard_error")
ENGINES = ("engine", "engine, recalibrated")


def platt(pairs: list[tuple[float, bool]], ridge: float = 1.0) -> tuple[float, float]:
    """(a, b) of sigmoid(a + b * logit(p)) fitted to what happened: Newton's method on the log loss, with a
    ridge pulling towards the identity (a = 0, b = 1) so a fleet whose p30 sits mostly at one value cannot
    drive the fit to a step, and each step halved until the loss falls."""
    xs = [math.log(min(max(p, 1e-6), 1 - 1e-6) / (1 - min(max(p, 1e-6), 1 - 1e-6))) for p, _ in pairs]
    ys = [1.0 if y else 0.0 for _, y in pairs]

    def q_of(z: float) -> float:
        return 1 / (1 + math.exp(-z)) if z > -700 else 0.0

    def loss(a: float, b: float) -> float:
        total = ridge * (a * a + (b - 1) ** 2) / 2
        for x, y in zip(xs, ys, strict=True):
            q = min(max(q_of(a + b * x), 1e-12), 1 - 1e-12)
            total -= y * math.log(q) + (1 - y) * math.log(1 - q)
        return total

    a, b = 0.0, 1.0
    for _ in range(100):
        ga, gb, haa, hab, hbb = ridge * a, ridge * (b - 1), ridge, 0.0, ridge
        for x, y in zip(xs, ys, strict=True):
            q = q_of(a + b * x)
            ga, gb = ga + (q - y), gb + (q - y) * x
            w = q * (1 - q)
            haa, hab, hbb = haa + w, hab + w * x, hbb + w * x * x
        det = haa * hbb - hab * hab
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        before, step = loss(a, b), 1.0
        while step > 1e-6 and loss(a - step * da, b - step * db) > before:
            step /= 2
        a, b = a - step * da, b - step * db
        if step * (abs(da) + abs(db)) < 1e-9:
            break
    return a, b


def run(
    seeds: tuple[int, ...], shape: Shape, econ: EconomicsSection
) -> tuple[dict[int, dict[str, Ledger]], tuple[float, float]]:
    """Every row's ledger per seed, and the recalibration fitted on TRAIN_SEEDS."""
    weights = load_rules().predictor
    baseline = 1 / (1 + math.exp(-weights.intercept))
    committed = committed_predictor(weights)
    seen = [
        pair
        for seed in TRAIN_SEEDS
        for pair in Simulation(seed, "run_to_failure", shape, econ, committed, baseline).run().calibration
    ]
    a, b = platt(seen)
    predictors = {"committed": committed, "recalibrated": recalibrated(committed, a, b)}
    results = {
        seed: {
            name: Simulation(seed, policy, shape, econ, predictors[which], baseline).run()  # type: ignore[arg-type]
            for name, policy, which in RUNS
        }
        for seed in seeds
    }
    return results, (a, b)


def _spread(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):>10,.0f} ± {sd:>8,.0f}  [{min(xs):>9,.0f} .. {max(xs):>9,.0f}]"


def figures(results: dict[int, dict[str, Ledger]]) -> dict[str, Any]:
    names = [name for name, _, _ in RUNS]
    per_seed = {seed: {n: round(ledgers[n].total, 2) for n in names} for seed, ledgers in results.items()}
    saving = {
        f"{engine} vs {base}": [per_seed[s][base] - per_seed[s][engine] for s in per_seed]
        for engine in ENGINES
        for base in BASELINES
    }
    counts = {n: sum((results[s][n].count for s in results), Counter()) for n in names}
    costs: dict[str, defaultdict[str, float]] = {n: defaultdict(float) for n in names}
    for ledgers in results.values():
        for n in names:
            for kind, money in ledgers[n].cost.items():
                costs[n][kind] += money
    pairs = [pair for s in results for pair in results[s]["run_to_failure"].calibration]
    bins = []
    for lo, hi in ((0, 0.05), (0.05, 0.2), (0.2, 0.5), (0.5, 1.01)):
        inside = [failed for p, failed in pairs if lo <= p < hi]
        mean_p = statistics.mean([p for p, _ in pairs if lo <= p < hi]) if inside else None
        bins.append(
            {
                "p30": f"{lo:g}-{min(hi, 1):g}",
                "n": len(inside),
                "mean_p": mean_p,
                "failed_within_30d": sum(inside) / len(inside) if inside else None,
            }
        )
    return {"per_seed": per_seed, "saving": saving, "counts": counts, "costs": costs, "calibration": bins}


def render(f: dict[str, Any], shape: Shape, seeds: tuple[int, ...]) -> str:
    n, names = len(seeds), [name for name, _, _ in RUNS]
    a, b = f["recalibration"]
    lines = [
        f"{shape.gpus} GPUs, {shape.days} days decided + {shape.tail_days} run to failure, "
        f"{shape.spares} spares, seeds {seeds[0]}..{seeds[-1]} ({n}); total cost per fleet-year (USD, "
        "against a fleet that never fails)",
        "",
        f"{'policy':<18}{'mean ± sd  [min .. max] over seeds':>52}",
    ]
    for p in names:
        lines.append(f"{p:<22}{_spread([f['per_seed'][s][p] for s in f['per_seed']]):>48}")
    lines.append("")
    for pair, xs in f["saving"].items():
        wins = sum(x > 0 for x in xs)
        lines.append(f"saving of {pair:<38}{_spread(xs)}   better on {wins}/{n} seeds")
    lines.append(
        f"(recalibrated: p' = sigmoid({a:.3f} + {b:.3f} logit p), fitted on seeds {TRAIN_SEEDS} run to "
        "failure)"
    )
    lines += ["", f"{'all seeds':<22}" + "".join(f"{c:>15}" for c in COUNTS)]
    for p in names:
        lines.append(f"{p:<22}" + "".join(f"{f['counts'][p].get(c, 0):>15}" for c in COUNTS))
    kinds = sorted({k for p in names for k in f["costs"][p]})
    lines += ["", f"{'cost by kind, per seed':<22}" + "".join(f"{k:>22}" for k in names)]
    for k in kinds:
        lines.append(f"{k:<22}" + "".join(f"{f['costs'][p].get(k, 0) / n:>22,.0f}" for p in names))
    lines += [
        "",
        "the committed predictor on these fleets (GPUs in service, weekly): p30 bin, n, mean p30, "
        "failed within 30 d",
    ]
    for b in f["calibration"]:
        mean_p = "-" if b["mean_p"] is None else f"{b['mean_p']:.3f}"
        seen = "-" if b["failed_within_30d"] is None else f"{b['failed_within_30d']:.3f}"
        lines.append(f"  {b['p30']:<10}{b['n']:>8}{mean_p:>10}{seen:>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.lifecycle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--gpus", type=int, default=Shape().gpus)
    parser.add_argument("--days", type=int, default=Shape().days)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    shape = Shape(gpus=args.gpus, days=args.days, spares=max(1, round(args.gpus * 0.02)))
    seeds = tuple(args.seeds)
    results, fitted = run(seeds, shape, EconomicsSection())
    found = {**figures(results), "recalibration": fitted}
    print(render(found, shape, seeds))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, default=dict))
    return 0


if __name__ == "__main__":
    sys.exit(main())

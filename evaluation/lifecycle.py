"""`python -m evaluation.lifecycle` (and `make evaluate`): does following the lifecycle engine save money?

Simulated fleets (evaluation/lifecycle_world.py: GPUs bought over the last
3.8 years with three-year warranties, training, inference and idle work,
defects that wear out with precursors or fail at once, GPUs that stick) live
a year under each policy (evaluation/lifecycle_sim.py): the engine as
shipped (services.lifecycle's decisions on the committed predictor's score
through the committed calibration, config/predictor-calibration.toml, fitted
on other seeds), the same engine taking the bare score as the probability,
the same engine with no prediction at all (what its decisions on GPUs that
stuck or died are worth alone), running every GPU to failure, and sending a
GPU back at its first hard error. Each
seed is one fleet, the same for every row. The report gives each policy's
total cost per seed, the engine's saving against each baseline with its
spread over seeds, how many GPUs each sent back had failed or would have, how
many came back with no fault found, and how many defects that showed while the
warranty ran were paid for after it ended. A saving that is not there is
reported as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from services.lifecycle.calibration import Calibration, Reliability, load_calibration, reliability
from services.lifecycle.run import baseline_p30, baseline_score
from services.lifecycle.settings import PREDICTOR_CALIBRATION_FILE, PREDICTOR_WEIGHTS_FILE, EconomicsSection
from services.scorer.rules_config import load_rules

from .calibrate import HELD_OUT_SEEDS, TRAIN_SEEDS
from .lifecycle_sim import Ledger, Simulation, committed_predictor
from .lifecycle_world import Shape

SEEDS = tuple(range(201, 207))
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
# The rows: (name, policy, what the engine reads: the calibrated probability, the bare score taken as one,
# or no prediction at all, so that it acts only once a GPU sticks or dies)
RUNS = (
    ("engine", "engine", "calibrated"),
    ("engine, bare score", "engine", "bare"),
    ("engine, no prediction", "engine", "none"),
    ("run_to_failure", "run_to_failure", "calibrated"),
    ("first_hard_error", "first_hard_error", "calibrated"),
)
BASELINES = ("run_to_failure", "first_hard_error")
ENGINES = ("engine", "engine, bare score", "engine, no prediction")


def run(
    seeds: tuple[int, ...], shape: Shape, econ: EconomicsSection, calibration: Calibration
) -> dict[int, dict[str, Ledger]]:
    """Every row's ledger per seed: the engine as shipped reads `calibration` (fitted on other seeds)."""
    fitted_on = set(TRAIN_SEEDS) | set(HELD_OUT_SEEDS)
    if fitted_on & set(seeds):
        raise ValueError(f"seeds {sorted(fitted_on & set(seeds))} fitted or tested the calibration")
    predictor = committed_predictor(load_rules().predictor)
    bare = baseline_score(PREDICTOR_WEIGHTS_FILE)
    calibrated = baseline_p30(PREDICTOR_WEIGHTS_FILE, calibration)
    return {
        seed: {
            name: Simulation(
                seed, policy, shape, econ, predictor, bare if reads == "bare" else calibrated,  # type: ignore[arg-type]
                calibration=None if reads == "bare" else calibration, predicts=reads != "none",
            ).run()
            for name, policy, reads in RUNS
        }
        for seed in seeds
    }  # fmt: skip


def _spread(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):>10,.0f} ± {sd:>8,.0f}  [{min(xs):>9,.0f} .. {max(xs):>9,.0f}]"


def figures(results: dict[int, dict[str, Ledger]], calibration: Calibration) -> dict[str, Any]:
    names = [name for name, _, _ in RUNS]
    per_seed = {seed: {n: round(ledgers[n].total, 2) for n in names} for seed, ledgers in results.items()}
    against = [(engine, base) for engine in ENGINES for base in BASELINES]
    against.append(("engine", "engine, no prediction"))  # what the prediction itself adds
    saving = {
        f"{engine} vs {base}": [per_seed[s][base] - per_seed[s][engine] for s in per_seed]
        for engine, base in against
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
        inside = [(score, failed) for score, failed in pairs if lo <= score < hi]
        known = [p for score, _ in inside if (p := calibration.calibrate(score).p_fail_30d) is not None]
        bins.append(
            {
                "score": f"{lo:g}-{min(hi, 1):g}",
                "n": len(inside),
                "mean_score": statistics.mean(x for x, _ in inside) if inside else None,
                "mean_calibrated": statistics.mean(known) if known else None,
                "failed_within_30d": sum(y for _, y in inside) / len(inside) if inside else None,
            }
        )
    on_these: Reliability = reliability(calibration, pairs)
    return {
        "per_seed": per_seed,
        "saving": saving,
        "counts": counts,
        "costs": costs,
        "calibration": bins,
        "reliability": on_these,
    }


def render(f: dict[str, Any], shape: Shape, seeds: tuple[int, ...]) -> str:
    n, names = len(seeds), [name for name, _, _ in RUNS]
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
        lines.append(f"saving of {pair:<45}{_spread(xs)}   better on {wins}/{n} seeds")
    lines.append(
        f"(the engine as shipped reads {f['calibration_file']}, fitted on seeds "
        f"{TRAIN_SEEDS[0]}..{TRAIN_SEEDS[-1]} run to failure; the bare score's row takes the "
        "predictor's score as the probability; the no-prediction row gets none, and acts only on GPUs that "
        "stuck or died)"
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
        "the committed predictor on these fleets (GPUs in service, weekly): score bin, n, mean score, "
        "mean calibrated p30, failed within 30 d",
    ]
    for b in f["calibration"]:
        said = [
            "-" if b[k] is None else f"{b[k]:.3f}"
            for k in ("mean_score", "mean_calibrated", "failed_within_30d")
        ]
        lines.append(f"  {b['score']:<10}{b['n']:>8}" + "".join(f"{x:>10}" for x in said))
    r = f["reliability"]
    lines.append(
        f"  {r.samples} GPU-weeks ({r.unsupported} with no support): Brier {r.brier:.5f} calibrated, "
        f"{r.brier_uncalibrated:.5f} bare; ECE {r.ece:.5f} calibrated, {r.ece_uncalibrated:.5f} bare"
    )
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
    parser.add_argument(
        "--remedy-outcomes", type=Path,
        help="what resets did in the remediator's outcome runs (evaluation.outcomes --remedy-outcomes): the"
        " engine reads how often a reset held and how long it kept a GPU out from there",
    )  # fmt: skip
    args = parser.parse_args(argv)
    shape = Shape(gpus=args.gpus, days=args.days, spares=max(1, round(args.gpus * 0.02)))
    seeds = tuple(args.seeds)
    calibration = load_calibration(PREDICTOR_CALIBRATION_FILE, weights_file=PREDICTOR_WEIGHTS_FILE)
    econ, measured = economics(args.remedy_outcomes)
    results = run(seeds, shape, econ, calibration)
    found = {
        **figures(results, calibration),
        "calibration_file": calibration.name,
        "remedy_outcomes": measured,
    }
    print(render(found, shape, seeds))
    if measured:
        print("  read from the remediator's outcome runs: "
              + ", ".join(f"{k} {v:.3f}" for k, v in sorted(measured.items())))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, default=_plain))
    return 0


def economics(remedy_outcomes: Path | None) -> tuple[EconomicsSection, dict[str, float]]:
    """The engine's economics, with what the remediator's outcome runs measured of a reset in place of the
    assumed figures (evaluation/outcomes.py; those it could not measure keep their defaults)."""
    if remedy_outcomes is None:
        return EconomicsSection(), {}
    raw = json.loads(remedy_outcomes.read_text())
    known = ("reset_fix_probability", "reset_fix_probability_after_reset", "reset_downtime_h")
    measured = {k: float(v) for k, v in raw.items() if k in known}
    return EconomicsSection.model_validate({**EconomicsSection().model_dump(), **measured}), measured


def _plain(x: object) -> object:
    return asdict(x) if is_dataclass(x) and not isinstance(x, type) else dict(x)  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())

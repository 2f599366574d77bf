"""`python -m evaluation.train` (`make train-predictor`): fit the predictor's weights on simulated fleets.

Simulates the default suite's scenario for each TRAINING seed (never one the
evaluation reports on), reads the predictor's inputs every simulated hour with
the scorer's own query, and labels each (GPU, hour) 1 when the GPU's ground
truth has a hard failure later in the run, 0 when it has none. Left out: the
hours after a failure (it is a verdict by then); the hours of a failing GPU
before its precursor began (nothing observable tells it from a healthy one);
and GPUs whose failure has no precursor at all (sudden DBEs, XIDs, repeated
falls off the bus). The last two are not learnable from any precursor, and at
the suite's density (a quarter of the fleet failing within three days, far
above any real fleet) they would only teach the intercept the simulation's
failure rate. The evaluation's calibration figures use the same population.

The model is a logistic regression fitted by Newton's method with a small L2
penalty; a term whose weight comes out negative (more of a precursor would
mean less risk) is dropped and the rest refitted. Deterministic: the same
seeds give the same file. Writes config/predictor-weights.toml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from services.scorer.predict import TERMS, model_inputs
from services.scorer.rules_config import DEFAULT_RULES, load_rules
from shared.settings.common import Settings

from .run import Record, run_scenario
from .scenario import generated_scenario

TRAIN_SEEDS = (1, 2, 3, 4)
L2 = 0.5


def samples(rec: Record) -> tuple[list[list[float]], list[int]]:
    failures: dict[str, dict[str, Any]] = rec.truth["failures"]
    sudden = {g for g, f in failures.items() if f["precursor_start_ms"] is None}
    xs, ys = [], []
    for t, per_gpu in rec.features:
        for gpu, raw in per_gpu.items():
            fail = failures.get(gpu)
            if gpu in sudden or (
                fail is not None and not fail["precursor_start_ms"] <= t < fail["failure_ms"]
            ):
                continue
            xs.append(model_inputs(raw))
            ys.append(int(fail is not None))
    return xs, ys


def fit(x: np.ndarray, y: np.ndarray, l2: float = L2) -> tuple[float, np.ndarray]:
    """Logistic regression with non-negative weights: Newton steps, dropping negative terms."""
    active = list(range(x.shape[1]))
    while True:
        a = np.hstack([np.ones((x.shape[0], 1)), x[:, active]])
        w = np.zeros(a.shape[1])
        penalty = np.full(a.shape[1], l2)
        penalty[0] = 0.0  # the intercept is not shrunk
        for _ in range(100):
            p = 1 / (1 + np.exp(-np.clip(a @ w, -50, 50)))
            grad = a.T @ (p - y) + penalty * w
            hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty + 1e-9)
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.max(np.abs(step)) < 1e-8:
                break
        negative = [active[i - 1] for i in range(1, len(w)) if w[i] < 0]
        if not negative:
            full = np.zeros(x.shape[1])
            full[active] = w[1:]
            return float(w[0]), full
        active = [i for i in active if i not in negative]


def write_weights(
    path: Path, intercept: float, weights: np.ndarray, seeds: tuple[int, ...], note: str
) -> None:
    lines = [
        "# The failure predictor's fitted weights: written by `make train-predictor` (evaluation/train.py),",
        "# reviewed like config/health-rules.toml. Inputs: services/scorer/predict.py (TERMS);",
        "# counts and rates enter as log(1 + x). Do not edit by hand: change the trainer and refit.",
        f"# {note}",
        f"intercept = {intercept:.6f}",
        f"trained_on_seeds = [{', '.join(str(s) for s in seeds)}]",
        "",
        "[weights]",
        *(f"{name} = {w:.6f}" for name, w in zip(TERMS, weights, strict=True)),
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=list(TRAIN_SEEDS))
    parser.add_argument("--hours", type=float, default=72.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_RULES.parent / "predictor-weights.toml")
    args = parser.parse_args(argv)
    rules = load_rules()
    settings = Settings()
    xs: list[list[float]] = []
    ys: list[int] = []
    for seed in args.seeds:
        rec = run_scenario(settings.db, generated_scenario(seed, hours=args.hours), seed, rules,
                           score=False, features=True)  # fmt: skip
        x, y = samples(rec)
        xs += x
        ys += y
        print(f"seed {seed}: {len(y)} GPU-hours, {sum(y)} before a failure")
    x_arr, y_arr = np.array(xs), np.array(ys, dtype=float)
    intercept, weights = fit(x_arr, y_arr)
    p = 1 / (1 + np.exp(-(intercept + x_arr @ weights)))
    brier = float(np.mean((p - y_arr) ** 2))
    note = f"{len(ys)} GPU-hours ({int(sum(ys))} before a failure), training Brier score {brier:.4f}"
    write_weights(args.out, intercept, weights, tuple(args.seeds), note)
    print(f"wrote {args.out}: {note}")
    for name, w in zip(TERMS, weights, strict=True):
        print(f"  {name:<30}{w:>10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m evaluation.calibrate` (`make calibrate-predictor`): fit the lifecycle engine's calibration.

The predictor's score is mapped to what was observed (services/lifecycle/
calibration.py) on the lifecycle evaluation's simulated fleets
(evaluation/lifecycle_world.py), each lived for a year run to failure: every
day, each GPU in service gives one (score, failed within 30 days) pair. The
fit uses TRAIN_SEEDS only; HELD_OUT_SEEDS measure its reliability (Brier
score and expected calibration error, against the bare score's); neither set
meets the seeds the lifecycle evaluation reports on (evaluation.lifecycle.
SEEDS). Deterministic: the same inputs give the same file. Writes
config/predictor-calibration.toml, with the digest of every file the fit
depends on, so a test can tell when it is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.lifecycle.calibration import Calibration, Reliability, fit_bins, reliability, sha256_of
from services.lifecycle.run import baseline_score
from services.lifecycle.settings import PREDICTOR_CALIBRATION_FILE, PREDICTOR_WEIGHTS_FILE, EconomicsSection
from services.scorer.rules_config import load_rules

from .lifecycle_sim import Simulation, committed_predictor
from .lifecycle_world import Shape

TRAIN_SEEDS = tuple(range(101, 117))
HELD_OUT_SEEDS = tuple(range(151, 155))
MIN_BIN_SAMPLES = 1000  # GPU-days: a bin's rate rests on at least this many
ROOT = Path(__file__).resolve().parents[1]
# Every file whose change can change the fit: the predictor, the fleets, the sampling, the fit itself.
INPUTS = (
    "config/predictor-weights.toml",
    "services/scorer/predict.py",
    "services/lifecycle/calibration.py",
    "services/lifecycle/settings.py",
    "evaluation/lifecycle_world.py",
    "evaluation/lifecycle_sim.py",
    "evaluation/calibrate.py",
)


def observed(seeds: tuple[int, ...], shape: Shape | None = None) -> list[tuple[float, bool]]:
    """(the predictor's score, failed within 30 days) for each GPU in service, each day, run to failure."""
    weights = load_rules().predictor
    predictor = committed_predictor(weights)
    pairs: list[tuple[float, bool]] = []
    for seed in seeds:
        sim = Simulation(
            seed, "run_to_failure", shape or Shape(), EconomicsSection(), predictor, 0.0,
            calibration=None, sample_every_days=1,
        )  # fmt: skip
        pairs += sim.run().calibration
    return pairs


def input_digests() -> dict[str, str]:
    return {name: sha256_of(ROOT / name) for name in INPUTS}


def render(
    calibration: Calibration, held_out: Reliability, baseline: float, digests: dict[str, str], note: str
) -> str:
    lines = [
        "# The lifecycle engine's calibration of the failure predictor's score to p(fail within 30 days):",
        "# written by `make calibrate-predictor` (evaluation/calibrate.py), reviewed like the weights it",
        "# belongs to. Do not edit by hand: change the inputs and refit; a test fails while it is stale.",
        f"# {note}",
        'method = "bins of scores, Jeffreys prior, pooled adjacent violators (never falls as scores rise)"',
        'outcome = "a GPU in service fails within 30 days (GPU-days of simulated fleets run to failure)"',
        f'predictor_weights_sha256 = "{calibration.predictor_weights_sha256}"',
        f"fitted_on_seeds = [{', '.join(str(s) for s in TRAIN_SEEDS)}]",
        f"held_out_seeds = [{', '.join(str(s) for s in HELD_OUT_SEEDS)}]",
        f"min_bin_samples = {MIN_BIN_SAMPLES}",
        f"baseline_score = {baseline}",
        "",
        "[held_out]  # the calibration (and the bare score) on the held-out seeds",
        f"samples = {held_out.samples}",
        f"unsupported = {held_out.unsupported}",
        f"brier = {held_out.brier:.6f}",
        f"ece = {held_out.ece:.6f}",
        f"brier_uncalibrated = {held_out.brier_uncalibrated:.6f}",
        f"ece_uncalibrated = {held_out.ece_uncalibrated:.6f}",
        "",
        "[inputs]  # sha256 of every file the fit depends on",
        *(f'"{name}" = "{digest}"' for name, digest in digests.items()),
    ]
    for b in calibration.bins:
        lines += [
            "",
            "[[bins]]",
            f"score_from = {b.score_from}",
            f"score_to = {b.score_to}",
            f"samples = {b.samples}",
            f"failed = {b.failed}",
            f"p_fail_30d = {b.p_fail_30d}",
        ]
    return "\n".join(lines) + "\n"


def fitted() -> tuple[Calibration, Reliability]:
    """The calibration of the committed predictor on TRAIN_SEEDS, and its reliability on HELD_OUT_SEEDS."""
    bins = fit_bins(observed(TRAIN_SEEDS), min_bin_samples=MIN_BIN_SAMPLES)
    calibration = Calibration("fit", bins, sha256_of(PREDICTOR_WEIGHTS_FILE))
    return calibration, reliability(calibration, observed(HELD_OUT_SEEDS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=PREDICTOR_CALIBRATION_FILE)
    args = parser.parse_args(argv)
    calibration, held = fitted()
    samples = sum(b.samples for b in calibration.bins)
    failed = sum(b.failed for b in calibration.bins)
    note = f"{samples} GPU-days ({failed} within 30 days of a failure) in {len(calibration.bins)} bins"
    text = render(calibration, held, baseline_score(PREDICTOR_WEIGHTS_FILE), input_digests(), note)
    args.out.write_text(text)
    print(f"wrote {args.out}: {note}")
    print(f"  {'score from':>10}{'GPU-days':>10}{'failed':>8}{'p30':>10}")
    for b in calibration.bins:
        print(f"  {b.score_from:>10.4f}{b.samples:>10}{b.failed:>8}{b.p_fail_30d:>10.4f}")
    print(
        f"held out (seeds {HELD_OUT_SEEDS[0]}..{HELD_OUT_SEEDS[-1]}, {held.samples} GPU-days, "
        f"{held.unsupported} unsupported): Brier {held.brier:.5f} "
        f"(bare score {held.brier_uncalibrated:.5f}), ECE {held.ece:.5f} "
        f"(bare score {held.ece_uncalibrated:.5f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

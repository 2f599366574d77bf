"""The committed calibration (config/predictor-calibration.toml) is fresh and keeps its reliability.

Stale: a file it was fitted from changed since (`make calibrate-predictor`
refits it). Worse: on the held-out seeds, which it never saw, its Brier score
or calibration error passes a bound, or no longer beats the bare score's.
"""

from __future__ import annotations

import tomllib

import pytest

from evaluation.calibrate import HELD_OUT_SEEDS, INPUTS, MIN_BIN_SAMPLES, TRAIN_SEEDS, input_digests, observed
from evaluation.lifecycle import SEEDS
from services.lifecycle.calibration import load_calibration, reliability, sha256_of
from services.lifecycle.run import baseline_score
from services.lifecycle.settings import PREDICTOR_CALIBRATION_FILE, PREDICTOR_WEIGHTS_FILE

COMMITTED = tomllib.loads(PREDICTOR_CALIBRATION_FILE.read_text())
# What the held-out seeds must show: the calibrated probability off by at most half a percentage point
# on average (ECE), that error at most a fifth of the bare score's, and a lower Brier score than it.
ECE_BOUND = 0.005
BETTER_THAN_BARE = 5.0


def test_the_calibration_is_fitted_on_the_inputs_as_they_are_now() -> None:
    recorded = COMMITTED["inputs"]
    assert set(recorded) == set(INPUTS)
    stale = [name for name, digest in input_digests().items() if recorded[name] != digest]
    assert not stale, f"changed since the calibration was fitted: {stale}; run `make calibrate-predictor`"
    assert COMMITTED["predictor_weights_sha256"] == sha256_of(PREDICTOR_WEIGHTS_FILE)
    assert COMMITTED["fitted_on_seeds"] == list(TRAIN_SEEDS)
    assert COMMITTED["held_out_seeds"] == list(HELD_OUT_SEEDS)
    assert COMMITTED["min_bin_samples"] == MIN_BIN_SAMPLES
    assert COMMITTED["baseline_score"] == baseline_score(PREDICTOR_WEIGHTS_FILE)


def test_no_seed_both_fits_and_tests_the_calibration_or_is_evaluated_on() -> None:
    assert not set(TRAIN_SEEDS) & set(HELD_OUT_SEEDS)
    assert not (set(TRAIN_SEEDS) | set(HELD_OUT_SEEDS)) & set(SEEDS)


def test_on_seeds_it_never_saw_the_calibration_is_as_reliable_as_recorded_and_within_bounds() -> None:
    calibration = load_calibration(PREDICTOR_CALIBRATION_FILE, weights_file=PREDICTOR_WEIGHTS_FILE)
    r = reliability(calibration, observed(HELD_OUT_SEEDS))
    held = COMMITTED["held_out"]
    assert (r.samples, r.unsupported) == (held["samples"], held["unsupported"])
    assert r.brier == pytest.approx(held["brier"], abs=1e-6)
    assert r.ece == pytest.approx(held["ece"], abs=1e-6)
    assert r.unsupported == 0
    assert r.ece <= ECE_BOUND
    assert r.ece * BETTER_THAN_BARE <= r.ece_uncalibrated
    assert r.brier < r.brier_uncalibrated

"""Fitting the predictor (issue 16): reproducible, non-negative, labelled by the failure time."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from evaluation.run import Record
from evaluation.train import fit, samples, write_weights
from services.scorer.predict import TERMS, model_inputs, predict_one
from services.scorer.rules_config import PredictorWeights

H = 3_600_000


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(600) < 0.3).astype(float)
    x = np.zeros((600, len(TERMS)))
    x[:, 0] = y * rng.uniform(1, 3, 600) + rng.uniform(0, 0.5, 600)  # a real precursor
    x[:, 2] = (1 - y) * rng.uniform(0, 2, 600)  # "more of it, less risk": must not get a weight
    return x, y


def test_the_fit_is_reproducible_and_never_rewards_a_precursor_with_less_risk(tmp_path: Path) -> None:
    x, y = _data(3)
    b1, w1 = fit(x, y)
    b2, w2 = fit(x, y)
    assert b1 == b2
    assert np.array_equal(w1, w2)
    assert w1[0] > 1
    assert (w1 >= 0).all()
    assert w1[2] == 0
    out = tmp_path / "w.toml"
    write_weights(out, b1, w1, (1, 2), "test")
    model = PredictorWeights.model_validate(tomllib.loads(out.read_text()))
    assert model.trained_on_seeds == [1, 2]
    assert set(model.weights) == set(TERMS)
    sick = predict_one("g", {"sbe_growth_per_hour": 20.0}, model)
    assert sick.p_fail_30d > 0.9
    assert [r["factor"] for r in sick.reasons] == ["sbe_growth_per_hour"]


def test_training_samples_follow_the_failure_time_and_leave_out_what_cannot_be_learnt() -> None:
    failures = {
        "GPU-a": {"failure_ms": 50 * H, "precursor_start_ms": 10 * H},
        "GPU-sudden": {"failure_ms": 30 * H, "precursor_start_ms": None},
    }
    truth = {"faults": [], "failures": failures}
    rec = Record(scenario="t", seed=1, poll_s=120, score_every_s=300, end_ms=72 * H, truth=truth,
                 gpus=["GPU-a", "GPU-ok", "GPU-sudden"])  # fmt: skip
    raw = {"sbe_growth_per_hour": 1.0}
    rec.features = [(t * H, {"GPU-a": raw, "GPU-ok": raw, "GPU-sudden": raw}) for t in (5, 20, 49, 51)]
    xs, ys = samples(rec)
    # GPU-ok at every hour (0); GPU-a only between its precursor and its failure (1); never GPU-sudden
    assert ys == [0, 1, 0, 1, 0, 0]
    assert xs[0] == model_inputs(raw)

"""The calibration of the predictor's score to p(fail in 30 d): its fit, its file, the decisions it prices."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.lifecycle.calibration import (
    Bin,
    Calibration,
    fit_bins,
    load_calibration,
    reliability,
)
from services.lifecycle.costs import Option
from services.lifecycle.decide import GpuFacts, decide
from services.lifecycle.run import baseline_p30, baseline_score
from services.lifecycle.settings import PREDICTOR_CALIBRATION_FILE, PREDICTOR_WEIGHTS_FILE, EconomicsSection
from shared.plumbing.errors import ConfigError
from tests.helpers.lifecycle import TODAY, bought, busy

E = EconomicsSection()


def table(*bins: tuple[float, float, int, int, float]) -> Calibration:
    return Calibration("test.toml", tuple(Bin(*b) for b in bins), "0" * 64)


# A predictor that ranks but overstates: a GPU with no precursor scores 0.03 and fails 0.4 % of the time;
# any precursor (0.05 and up) means about one in five.
STEP = table((0.03, 0.03, 100_000, 400, 0.004), (0.05, 0.5, 2000, 380, 0.19), (0.6, 1.0, 2000, 460, 0.23))


def test_each_bin_is_its_rate_under_jeffreys_prior_worked_by_hand() -> None:
    pairs = [(0.03, i < 4) for i in range(1000)] + [(0.5, i < 200) for i in range(1000)]
    bins = fit_bins(pairs, min_bin_samples=1000)
    assert [(b.score_from, b.score_to, b.samples, b.failed) for b in bins] == [
        (0.03, 0.03, 1000, 4),
        (0.5, 0.5, 1000, 200),
    ]
    assert bins[0].p_fail_30d == pytest.approx(4.5 / 1001, abs=1e-6)
    assert bins[1].p_fail_30d == pytest.approx(200.5 / 1001, abs=1e-6)


def test_scores_are_gathered_until_a_bin_holds_enough_and_a_thin_top_joins_the_bin_below() -> None:
    pairs = [(s / 100, False) for s in range(1, 26) for _ in range(10)]  # 25 scores, 10 samples each
    bins = fit_bins(pairs, min_bin_samples=100)
    # 0.01-0.10 and 0.11-0.20 hold 100 each; the 50 at 0.21-0.25 are too few alone
    assert [(b.score_from, b.score_to, b.samples) for b in bins] == [(0.01, 0.1, 100), (0.11, 0.25, 150)]


def test_a_rate_that_falls_as_the_score_rises_is_pooled_with_its_neighbour() -> None:
    # 0.2 of 1000 at score 0.4, then 0.1 of 1000 at 0.9: not believable as risk, so one rate for both
    pairs = [(0.4, i < 200) for i in range(1000)] + [(0.9, i < 100) for i in range(1000)]
    low, high = fit_bins(pairs, min_bin_samples=1000)
    assert low.p_fail_30d == high.p_fail_30d == pytest.approx(300.5 / 2001, abs=1e-6)
    assert (low.samples, low.failed, high.samples, high.failed) == (1000, 200, 1000, 100)  # as seen


@pytest.mark.parametrize(
    ("pairs", "said"),
    [
        ([], "nothing to calibrate on"),
        ([(1.5, True)], "a score must be in"),
        ([(math.nan, False)], "a score must be in"),
    ],
)
def test_what_cannot_be_fitted_is_refused(pairs: list[tuple[float, bool]], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        fit_bins(pairs, min_bin_samples=10)


@settings(max_examples=150, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=400),
    min_bin=st.integers(1, 120),
)
def test_any_fit_is_a_valid_calibration_that_supports_every_score_it_saw(
    pairs: list[tuple[float, bool]], min_bin: int
) -> None:
    bins = fit_bins(pairs, min_bin_samples=min_bin)
    calibration = Calibration(
        "fit", bins, "0" * 64
    )  # validates: rising starts, probabilities that never fall
    assert sum(b.samples for b in bins) == len(pairs)
    assert sum(b.failed for b in bins) == sum(y for _, y in pairs)
    if len(bins) > 1:
        assert all(b.samples >= min_bin for b in bins)
    for score, _ in pairs:
        got = calibration.calibrate(score)
        assert got.p_fail_30d is not None, got.said
        assert 0 < got.p_fail_30d < 1
    assert calibration.calibrate(bins[-1].score_to + 1e-9).p_fail_30d is None
    assert calibration.calibrate(bins[0].score_from - 1e-9).p_fail_30d is None


@settings(max_examples=100, deadline=None)
@given(a=st.floats(0, 1), b=st.floats(0, 1))
def test_a_higher_score_never_calibrates_lower(a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    p_lo, p_hi = STEP.calibrate(lo).p_fail_30d, STEP.calibrate(hi).p_fail_30d
    if p_lo is not None and p_hi is not None:
        assert p_lo <= p_hi


def test_a_score_outside_what_was_seen_has_no_support_and_says_so() -> None:
    assert STEP.calibrate(0.02).p_fail_30d is None
    assert (
        STEP.calibrate(0.02).said == "test.toml has no support for score 0.02: it saw scores from 0.03 to 1"
    )
    assert STEP.calibrate(math.nan).p_fail_30d is None
    got = STEP.calibrate(0.55)  # between two bins' scores: the lower bin's, up to the next one's start
    assert got.p_fail_30d == 0.19
    assert got.said == (
        "test.toml: score 0.55 in [0.05, 0.6), where 380 of 2000 GPU-days failed within 30 days -> 0.19"
    )
    assert STEP.calibrate(1.0).said.startswith("test.toml: score 1 in [0.6, 1]")


@pytest.mark.parametrize(
    ("bins", "said"),
    [
        ((), "at least one bin"),
        (((0.5, 0.5, 10, 1, 0.1), (0.1, 0.2, 10, 1, 0.2)), "rising scores"),
        (((0.1, 0.1, 10, 1, 0.3), (0.5, 0.5, 10, 1, 0.2)), "never fall"),
        (((0.1, 0.1, 10, 1, 1.5),), r"\[0, 1\]"),
    ],
)
def test_a_table_that_is_not_a_calibration_is_refused(
    bins: tuple[tuple[float, float, int, int, float], ...], said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        table(*bins)


def test_reliability_worked_by_hand() -> None:
    pairs = [(0.03, False)] * 3 + [(0.03, True)] + [(0.9, True), (0.9, False)]
    r = reliability(STEP, [*pairs, (0.01, True)])
    assert (r.samples, r.unsupported) == (6, 1)
    # calibrated: 0.004 three times missed low, once for a failure; 0.23 for a failure and for none
    brier = (3 * 0.004**2 + (1 - 0.004) ** 2 + (1 - 0.23) ** 2 + 0.23**2) / 6
    assert r.brier == pytest.approx(brier)
    assert r.brier_uncalibrated == pytest.approx((3 * 0.03**2 + 0.97**2 + 0.1**2 + 0.9**2) / 6)
    # each bin: |sum of p - failures| over all samples
    assert r.ece == pytest.approx((abs(4 * 0.004 - 1) + abs(2 * 0.23 - 1)) / 6)
    assert r.ece_uncalibrated == pytest.approx((abs(4 * 0.03 - 1) + abs(2 * 0.9 - 1)) / 6)


# --- the file and the service ---------------------------------------------------------------------


def test_the_committed_calibration_belongs_to_the_committed_predictor_and_prices_its_baseline() -> None:
    calibration = load_calibration(PREDICTOR_CALIBRATION_FILE, weights_file=PREDICTOR_WEIGHTS_FILE)
    assert calibration.name.startswith("predictor-calibration.toml (")
    baseline = baseline_p30(PREDICTOR_WEIGHTS_FILE, calibration)
    # a GPU with no precursor: the bare score is its sigmoid(intercept); what such GPUs did is far less
    assert 0 < baseline < baseline_score(PREDICTOR_WEIGHTS_FILE)


def _copy(tmp_path: Path, text: str | None = None) -> tuple[Path, Path]:
    weights = tmp_path / "weights.toml"
    shutil.copy(PREDICTOR_WEIGHTS_FILE, weights)
    calibration = tmp_path / "calibration.toml"
    calibration.write_text(PREDICTOR_CALIBRATION_FILE.read_text() if text is None else text)
    return calibration, weights


def test_a_calibration_for_other_weights_refuses_to_start(tmp_path: Path) -> None:
    calibration, weights = _copy(tmp_path)
    weights.write_text(weights.read_text() + "# refitted\n")
    with pytest.raises(
        ConfigError, match=r"was fitted for other predictor weights.*make calibrate-predictor"
    ):
        load_calibration(calibration, weights_file=weights)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not toml [", "not a readable calibration"),
        ('predictor_weights_sha256 = "x"\n', "not a valid calibration.*bins"),
        (
            'predictor_weights_sha256 = "x"\n[[bins]]\nscore_from = "a"\nscore_to = 1\nsamples = 1\n'
            "failed = 0\np_fail_30d = 0.1\n",
            "score_from must be a number",
        ),
        (
            'predictor_weights_sha256 = "x"\n[[bins]]\nscore_from = 0.5\nscore_to = 1\nsamples = 1\n'
            "failed = 0\np_fail_30d = 0.1\n[[bins]]\nscore_from = 0.6\nscore_to = 1\nsamples = 1\n"
            "failed = 0\np_fail_30d = 0.05\n",
            "never fall",
        ),
    ],
)
def test_a_broken_calibration_file_is_one_clear_error(tmp_path: Path, text: str, said: str) -> None:
    calibration, weights = _copy(tmp_path, text)
    with pytest.raises(ConfigError, match=said):
        load_calibration(calibration, weights_file=weights)


def test_a_calibration_or_weights_file_that_is_not_there_names_itself(tmp_path: Path) -> None:
    calibration, _ = _copy(tmp_path)
    with pytest.raises(ConfigError, match=r"absent\.toml: cannot be read"):
        load_calibration(calibration, weights_file=tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=r"nowhere\.toml: not a readable calibration"):
        load_calibration(tmp_path / "nowhere.toml", weights_file=PREDICTOR_WEIGHTS_FILE)


# --- the decisions it prices ----------------------------------------------------------------------


def _busy(score: float | None) -> GpuFacts:
    """The big job of test_costs (256 GPUs, a spare on hand, 400 days of warranty left)."""
    return busy(score, bought(warranty_days=400, spares=2), job_gpus=256)


def test_a_decision_is_priced_on_the_calibrated_probability_and_its_terms_name_the_calibration() -> None:
    # the big job of test_costs: the bare score 0.9 sends it back; calibrated, 0.9 is a 0.23 chance: keep
    bare = decide(_busy(0.9), E, baseline_p30=0.03, today=TODAY, calibration=None)
    calibrated = decide(_busy(0.9), E, baseline_p30=0.004, today=TODAY, calibration=STEP)
    assert bare.choice is Option.RMA
    assert calibrated.choice is Option.KEEP
    terms = {t.name: (t.value, t.source) for t in calibrated.terms}
    assert terms["p_fail_30d_score"] == (0.9, "predictor")
    assert terms["p_fail_30d"] == (0.23, "calibration")
    assert terms["calibration"][0].startswith("test.toml: score 0.9 in [0.6, 1], where 460 of 2000")
    assert {t.name: t.value for t in bare.terms}["calibration"] == (
        "none: the predictor's score taken as the probability"
    )


def test_a_rising_calibrated_prediction_still_sends_the_gpu_back() -> None:
    sure = table((0.03, 0.03, 100_000, 400, 0.004), (0.05, 1.0, 2000, 1800, 0.9))
    assert decide(_busy(0.03), E, baseline_p30=0.004, today=TODAY, calibration=sure).choice is Option.KEEP
    assert decide(_busy(0.95), E, baseline_p30=0.004, today=TODAY, calibration=sure).choice is Option.RMA


def test_a_score_the_calibration_has_no_support_for_leaves_the_decision_open_and_says_why() -> None:
    d = decide(_busy(0.01), E, baseline_p30=0.004, today=TODAY, calibration=STEP)
    assert d.choice is None
    assert d.to_json()["decision"] == "undecided"
    assert "p_fail_30d" not in {t.name for t in d.terms}, "a guessed probability"
    assert d.why.startswith(
        "test.toml has no support for score 0.01: it saw scores from 0.03 to 1: left open"
    )
    assert d.missing[0].input == "the failure probability"
    assert "keep for p30 0-" in d.missing[0].effect


def test_a_failed_gpu_whose_score_has_no_support_is_priced_at_a_healthy_gpus_probability_and_says_so() -> (
    None
):
    facts = busy(0.01, bought(warranty_days=400), failed=True, finding="check_mechanicals")
    d = decide(facts, E, baseline_p30=0.004, today=TODAY, calibration=STEP)
    assert d.choice is not None
    assert ("p_fail_30d", 0.004, "assumption") in {(t.name, t.value, t.source) for t in d.terms}
    assert d.missing[0].input == "the failure prediction (would the vendor find a fault?)"

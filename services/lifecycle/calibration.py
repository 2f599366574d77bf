"""From the failure predictor's score to an observed p(fail within 30 days): a binned, isotonic calibration.

The predictor (services/scorer/predict.py) ranks GPUs by their precursors; its
p_fail_30d was fitted on short mock-fleet runs in which a precursor nearly
always ends in a failure, so taken as a probability it overstates the risk of
a GPU that merely drifts. Money needs the probability itself. The calibration
(config/predictor-calibration.toml, written by `make calibrate-predictor`)
maps the score to what was observed on fleets run to failure:

- the scores seen on the training fleets are cut into bins of at least
  `min_bin_samples` GPU-days each (a score the predictor gives many GPUs, such
  as its baseline for a GPU with no precursor, is a bin of its own);
- each bin's rate is (failed + 1/2) / (samples + 1), Jeffreys' prior, and
  neighbouring bins whose rates fall as the score rises are pooled (the pool
  adjacent violators) so a higher score never means a lower probability;
- a score outside the scores seen (below the lowest, above the highest) has
  no support: the calibration says so and gives no probability.

It belongs to one predictor: the file names the digest of the weights it was
fitted for, and a service given other weights refuses to start.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.plumbing.errors import ConfigError

PRIOR = 0.5  # Jeffreys' Beta(1/2, 1/2) on each bin's rate


@dataclass(frozen=True, slots=True)
class Bin:
    """Scores from `score_from` up to the next bin's (the last one up to and including `score_to`)."""

    score_from: float
    score_to: float  # the highest score seen in it
    samples: int
    failed: int
    p_fail_30d: float  # after the prior and the pooling


@dataclass(frozen=True, slots=True)
class Calibrated:
    """One score's calibration: the probability, or None where the calibration has no support for it."""

    score: float
    p_fail_30d: float | None
    said: str  # where it came from, in words (the decision's term), or why there is none


@dataclass(frozen=True, slots=True)
class Calibration:
    name: str  # what the decision's terms call it: the file and its digest
    bins: tuple[Bin, ...]
    predictor_weights_sha256: str

    def __post_init__(self) -> None:
        if not self.bins:
            raise ValueError("a calibration needs at least one bin")
        froms = [b.score_from for b in self.bins]
        if froms != sorted(set(froms)):
            raise ValueError("bins must start at rising scores")
        ps = [b.p_fail_30d for b in self.bins]
        if any(not 0 <= p <= 1 for p in ps) or ps != sorted(ps):
            raise ValueError("bin probabilities must be in [0, 1] and never fall as the score rises")
        if self.bins[-1].score_to < self.bins[-1].score_from:
            raise ValueError("the last bin ends before it starts")

    def calibrate(self, score: float) -> Calibrated:
        lo, hi = self.bins[0].score_from, self.bins[-1].score_to
        if not math.isfinite(score) or score < lo or score > hi:
            return Calibrated(
                score,
                None,
                f"{self.name} has no support for score {score:g}: it saw scores from {lo:g} to {hi:g}",
            )
        i = max(i for i, b in enumerate(self.bins) if b.score_from <= score)
        b = self.bins[i]
        upto = f"{self.bins[i + 1].score_from:g})" if i + 1 < len(self.bins) else f"{b.score_to:g}]"
        said = (
            f"{self.name}: score {score:g} in [{b.score_from:g}, {upto}, where {b.failed} of {b.samples} "
            f"GPU-days failed within 30 days -> {b.p_fail_30d:.4g}"
        )
        return Calibrated(score, b.p_fail_30d, said)


# --- fitting --------------------------------------------------------------------------------------


def fit_bins(pairs: Iterable[tuple[float, bool]], *, min_bin_samples: int) -> tuple[Bin, ...]:
    """Bins of at least `min_bin_samples` (the last may pool into its neighbour), each rate under Jeffreys'
    prior, pooled where it falls as the score rises."""
    if min_bin_samples < 1:
        raise ValueError("min_bin_samples must be at least 1")
    counts: dict[float, list[int]] = {}
    for score, failed in pairs:
        if not math.isfinite(score) or not 0 <= score <= 1:
            raise ValueError(f"a score must be in [0, 1], not {score!r}")
        c = counts.setdefault(score, [0, 0])
        c[0] += 1
        c[1] += bool(failed)
    if not counts:
        raise ValueError("nothing to calibrate on")
    # (score_from, score_to, samples, failed), cut once a bin holds enough
    raw: list[tuple[float, float, int, int]] = []
    for score in sorted(counts):
        n, k = counts[score]
        if raw and raw[-1][2] < min_bin_samples:
            lo, _, n0, k0 = raw.pop()
            raw.append((lo, score, n0 + n, k0 + k))
        else:
            raw.append((score, score, n, k))
    if len(raw) > 1 and raw[-1][2] < min_bin_samples:  # too few at the top: part of the bin below
        _, hi, n1, k1 = raw.pop()
        lo, _, n0, k0 = raw.pop()
        raw.append((lo, hi, n0 + n1, k0 + k1))
    # pool adjacent violators over the bins' rates (weighted by samples), each block's rate under the prior
    blocks: list[tuple[int, int, int]] = []  # (first bin, samples, failed)
    for i, (_, _, n, k) in enumerate(raw):
        blocks.append((i, n, k))
        while len(blocks) > 1 and _rate(*blocks[-2][1:]) >= _rate(*blocks[-1][1:]):
            _, n1, k1 = blocks.pop()
            first, n0, k0 = blocks.pop()
            blocks.append((first, n0 + n1, k0 + k1))
    out: list[Bin] = []
    for j, (first, n, k) in enumerate(blocks):
        end = blocks[j + 1][0] if j + 1 < len(blocks) else len(raw)
        p = round(_rate(n, k), 6)
        out += [Bin(lo, hi, n_bin, k_bin, p) for lo, hi, n_bin, k_bin in raw[first:end]]
    return tuple(out)


def _rate(samples: int, failed: int) -> float:
    return (failed + PRIOR) / (samples + 2 * PRIOR)


@dataclass(frozen=True, slots=True)
class Reliability:
    samples: int
    unsupported: int  # samples whose score the calibration has no support for (left out of the rest)
    brier: float
    ece: float  # expected calibration error over the calibration's bins
    brier_uncalibrated: float  # the score taken as a probability, on the same samples
    ece_uncalibrated: float


def reliability(calibration: Calibration, pairs: Iterable[tuple[float, bool]]) -> Reliability:
    """How well the calibration (and the bare score) foretold what happened on `pairs`."""
    seen: dict[int, list[float]] = {}  # bin -> [samples, failed, sum p, sum score]
    n = unsupported = 0
    brier = brier_raw = 0.0
    for score, failed in pairs:
        got = calibration.calibrate(score)
        if got.p_fail_30d is None:
            unsupported += 1
            continue
        y = 1.0 if failed else 0.0
        n += 1
        brier += (got.p_fail_30d - y) ** 2
        brier_raw += (score - y) ** 2
        i = max(i for i, b in enumerate(calibration.bins) if b.score_from <= score)
        s = seen.setdefault(i, [0.0, 0.0, 0.0, 0.0])
        s[0], s[1], s[2], s[3] = s[0] + 1, s[1] + y, s[2] + got.p_fail_30d, s[3] + score
    if n == 0:
        raise ValueError("no sample the calibration has support for")
    ece = sum(abs(s[2] - s[1]) for s in seen.values()) / n
    ece_raw = sum(abs(s[3] - s[1]) for s in seen.values()) / n
    return Reliability(n, unsupported, brier / n, ece, brier_raw / n, ece_raw)


# --- the file -------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from e


def load_calibration(path: Path, *, weights_file: Path) -> Calibration:
    """The calibration in `path`, checked against the predictor's weights it is used with."""
    try:
        with path.open("rb") as f:
            raw: dict[str, Any] = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: not a readable calibration ({e}); run `make calibrate-predictor`") from e
    try:
        digest = str(raw["predictor_weights_sha256"])
        bins = tuple(
            Bin(
                score_from=_number(b, "score_from"),
                score_to=_number(b, "score_to"),
                samples=int(b["samples"]),
                failed=int(b["failed"]),
                p_fail_30d=_number(b, "p_fail_30d"),
            )
            for b in raw["bins"]
        )
        calibration = Calibration(f"{path.name} ({sha256_of(path)[:12]})", bins, digest)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: not a valid calibration ({e}); run `make calibrate-predictor`") from e
    in_use = sha256_of(weights_file)
    if in_use != digest:
        raise ConfigError(
            f"{path} was fitted for other predictor weights (sha256 {digest[:12]}, {weights_file} is "
            f"{in_use[:12]}): run `make calibrate-predictor`"
        )
    return calibration


def _number(table: dict[str, Any], key: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a number, not {value!r}")
    return float(value)

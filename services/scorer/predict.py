"""Failure prediction from precursors: a fitted logistic model whose every term is reported.

p(fail within 30 days) = sigmoid(intercept + sum_i w_i * x_i), weights from
config/predictor-weights.toml (`make train-predictor`). The inputs are slow
signs of a coming failure only, never the failure itself (a DBE, an
uncorrectable remapped row or a critical XID is a verdict, not a predictor):

- the growth of corrected (SBE) errors per hour of elapsed time: the recent
  rate minus the rate over the rest of the trend window, less one count over
  the recent window (counters are whole numbers); a steady rate, however
  high, is the GPU's baseline and not a sign (a storm is a verdict's business);
- retired pages (SBE) and correctable remapped rows per day over the window;
- the growth of PCIe replays per hour, likewise; NVLink CRC errors per hour;
- heat not explained by load: the median, over the recent window, of the
  temperature above what the GPU's own power-to-temperature line over the
  earlier window predicts, less one degree (the sensor's resolution); a hot
  GPU at full power is on its line, a failing fan or heatsink drifts above it,
  and a half-hour spike does not move a median;
- the fraction of the window spent in hardware thermal slowdown.

Rates divide increments by elapsed time between rollup minutes, so they do not
depend on the poll cadence. Growth and heat need 6 h of history before the
recent window, so a GPU seen for a few hours has no trend yet. Counts enter as log(1 + x). p(fail within 7 days)
assumes a constant hazard over the 30 days.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from shared.store import verdict_inputs

from .features import Conn
from .rules_config import PredictorWeights, Rules

# The model's inputs, in a fixed order (the trainer and the weights file use these names). A
# steady error rate is a GPU's baseline, not a sign: rates enter only as growth over the GPU's
# own earlier rate (precursor_features also returns the plain rates, for the reasons' context).
TERMS = (
    "sbe_growth_per_hour",
    "memory_rows_per_day",
    "pcie_growth_per_hour",
    "nvlink_crc_per_hour",
    "heat_unexplained_c",
    "hw_thermal_slowdown_fraction",
)
_LOG_TERMS = frozenset(TERMS[:4])

_MIN_HOURS = 1.0  # rates are over at least an hour, so a GPU seen for minutes cannot spike one
_MIN_EARLIER_H = 6.0  # a trend needs this much history before the recent window
_HEAT_DEADBAND_C = 1.0  # GPU temperatures are whole degrees: less than one is noise


@dataclass(slots=True)
class Prediction:
    gpu_uuid: str
    p_fail_7d: float
    p_fail_30d: float
    reasons: list[dict[str, Any]] = field(default_factory=list)


def _rate(count: float, hours: float) -> float:
    return count / max(hours, _MIN_HOURS)


def precursor_features(
    conn: Conn, as_of: datetime, rules: Rules, gpus: Collection[str] | None = None
) -> dict[str, dict[str, float]]:
    """The model inputs of `gpus` (None: every GPU) as of a time (raw values, before the log transform)."""
    pr = rules.prediction
    cut = as_of.timestamp() - pr.recent_s
    out: dict[str, dict[str, float]] = {}
    found = verdict_inputs.precursors(
        conn,
        as_of,
        recent_s=pr.recent_s,
        trend_s=pr.trend_s,
        hw_thermal_mask=int(Reason.HW_THERMAL_SLOWDOWN),
        gpus=None if gpus is None else tuple(sorted(gpus)),
    )
    for row in found:
        (uuid, first, last, sbe_r, sbe_e, pcie_r, pcie_e, rows, crc_r, heat_c, hw_frac) = row
        first, last = float(first), float(last)
        recent_h = (last - max(first, cut)) / 3600
        earlier_h = (min(last, cut) - first) / 3600
        whole_h = (last - first) / 3600
        sbe_recent, pcie_recent = _rate(float(sbe_r), recent_h), _rate(float(pcie_r), recent_h)
        trend = earlier_h >= _MIN_EARLIER_H
        heat = max(float(heat_c) - _HEAT_DEADBAND_C, 0.0) if trend and heat_c is not None else 0.0
        # Counters are whole counts: a difference of one count over the recent window is resolution.
        resolution = 1 / max(recent_h, _MIN_HOURS)
        sbe_growth = sbe_recent - _rate(float(sbe_e), earlier_h) - resolution
        pcie_growth = pcie_recent - _rate(float(pcie_e), earlier_h) - resolution
        out[str(uuid)] = {
            "sbe_per_hour": sbe_recent,
            "sbe_growth_per_hour": max(sbe_growth, 0.0) if trend else 0.0,
            "memory_rows_per_day": _rate(float(rows), whole_h) * 24,
            "pcie_replays_per_hour": pcie_recent,
            "pcie_growth_per_hour": max(pcie_growth, 0.0) if trend else 0.0,
            "nvlink_crc_per_hour": _rate(float(crc_r), recent_h),
            "heat_unexplained_c": heat,
            "hw_thermal_slowdown_fraction": float(hw_frac or 0.0),
        }
    return out


def model_inputs(raw: dict[str, float]) -> list[float]:
    """The model's x: counts and rates as log(1 + x), the rest as they are; in TERMS order."""
    return [math.log1p(max(raw.get(t, 0.0), 0.0)) if t in _LOG_TERMS else raw.get(t, 0.0) for t in TERMS]


def predict_one(uuid: str, raw: dict[str, float], model: PredictorWeights) -> Prediction:
    """The probability and its reasons: every term that adds risk, with value and contribution."""
    xs = model_inputs(raw)
    contributions = {t: model.weights.get(t, 0.0) * x for t, x in zip(TERMS, xs, strict=True)}
    z = model.intercept + sum(contributions.values())
    p30 = 1 / (1 + math.exp(-z)) if z > -700 else 0.0
    p7 = 1 - (1 - p30) ** (7 / 30)
    reasons = [
        {"factor": t, "value": round(raw.get(t, 0.0), 3), "log_odds": round(c, 4)}
        for t, c in sorted(contributions.items(), key=lambda kv: -kv[1])
        if c > 0
    ]
    return Prediction(gpu_uuid=uuid, p_fail_7d=round(p7, 4), p_fail_30d=round(p30, 4), reasons=reasons)


def predict_all(
    conn: Conn, as_of: datetime, rules: Rules, gpus: Collection[str] | None = None
) -> dict[str, Prediction]:
    """The predictions of `gpus` (None: every GPU) seen in the trend window."""
    return {
        uuid: predict_one(uuid, raw, rules.predictor)
        for uuid, raw in precursor_features(conn, as_of, rules, gpus).items()
    }

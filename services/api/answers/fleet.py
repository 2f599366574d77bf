"""The fleet's answers: its summary, its GPUs ranked by risk."""

from __future__ import annotations

from pydantic import Field

from . import Answer, ApiTime, NextCursor, StoredList, Total


class OpenAlertCounts(Answer):
    """Unresolved alerts by severity (all three, 0 where none)."""

    critical: int = 0
    warning: int = 0
    info: int = 0


class PlaceCounts(Answer):
    cluster: str | None
    datacenter: str | None
    rack: str | None
    gpus: int
    healthy: int
    degraded: int
    unhealthy: int


class FleetSummary(Answer):
    """GPU counts by state and place, fleet aggregates, open alerts."""

    gpus: int
    healthy: int
    degraded: int
    unhealthy: int
    not_scored: int
    missing: int = Field(description="GPUs with no sample, or none recently (the rules' missing_after_s)")
    avg_temp_c: float | None
    max_temp_c: float | None
    power_w: float | None
    avg_util_pct: float | None
    open_alerts: OpenAlertCounts
    by_location: list[PlaceCounts]


class RankedPrediction(Answer):
    gpu_uuid: str
    hostname: str
    model: str
    rack: str | None
    time: ApiTime
    p_fail_7d: float
    p_fail_30d: float
    reasons: StoredList


class Predictions(Answer):
    predictions: list[RankedPrediction]
    total: Total
    limit: int
    next_cursor: NextCursor

"""The rules file and a healthy GPU's features, for the scorer's rule tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.scorer.features import GpuFeatures
from services.scorer.rules_config import load_rules

RULES = load_rules()
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
HEALTHY = GpuFeatures(
    gpu_uuid="GPU-1", hostname="n1", model="NVIDIA H100 80GB HBM3", last_time=NOW - timedelta(seconds=5),
    slowdown_c=87, power_limit_w=700, fb_total_mib=81559, temp_max=62, power_avg=450,
    reasons_any=0x4, minutes_long=60, util_max_idle_window=95, idle_minutes=10,
)  # fmt: skip

"""Sample records of a made-up fleet, in the wire format: what sink tests and benches feed the pipeline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-000000000000"


def sample(i: int, gpus: int = 50, **extra: Any) -> dict[str, Any]:
    """The i-th sample of a fleet of `gpus`: GPU i % gpus, 10 s after the previous round."""
    return {
        "schema_version": 1,
        "time": (T0 + timedelta(seconds=10 * (i // gpus))).isoformat(),
        "source": "mock",
        "collector_id": "itest",
        "collection_latency_ms": 2.0,
        "gpu_uuid": gpu_uuid(i % gpus),
        "gpu_index": i % 8,
        "model": "NVIDIA H100 80GB HBM3",
        "hostname": f"node-{(i % gpus) // 8:02d}",
        "cluster": "c1",
        "rack": "r1",
        "gpu_temp_c": 40 + i % 30,
        "power_usage_w": 100.0 + i % 500,
        "gpu_util_pct": i % 100,
        "ecc_dbe_volatile_total": 0,
        "fb_total_mib": 81559,
        "slowdown_temp_c": 87,
        **extra,
    }

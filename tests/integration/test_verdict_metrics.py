"""Verdict series read from TimescaleDB after a cycle: the cycle's GPUs only, hostnames, open alerts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.scorer.verdict_metrics import VerdictCollector
from shared.config import DatabaseSettings
from shared.db import connect

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _series(c: VerdictCollector) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = CollectorRegistry()
    registry.register(c)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _scored(conn: object, uuid: str, host: str, state: str, points: float, as_of: datetime) -> None:
    conn.execute(  # type: ignore[attr-defined]
        "INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, first_seen, last_seen)"
        " VALUES (%s, 'H100', 0, %s, now(), now())"
        " ON CONFLICT DO NOTHING", (uuid, host))  # fmt: skip
    conn.execute(  # type: ignore[attr-defined]
        "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, as_of)"
        " VALUES (%s, %s, %s, 'A', 'none', %s)"
        " ON CONFLICT (gpu_uuid) DO UPDATE SET state = EXCLUDED.state, score = EXCLUDED.score,"
        " as_of = EXCLUDED.as_of", (uuid, state, points, as_of))  # fmt: skip
    for sub in ("memory", "thermal"):
        sub_state = state if sub == "memory" else "healthy"
        conn.execute(  # type: ignore[attr-defined]
            "INSERT INTO gpu_health_current (gpu_uuid, subsystem, state, since, updated_at)"
            " VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (gpu_uuid, subsystem) DO UPDATE SET state = EXCLUDED.state",
            (uuid, sub, sub_state, as_of, as_of))  # fmt: skip


def test_verdicts_of_the_last_cycle_become_series_and_a_gpu_no_longer_scored_drops_out(
    migrated: DatabaseSettings,
) -> None:
    c = VerdictCollector()
    with connect(migrated) as conn:
        _scored(conn, "GPU-dbe", "node-7", "unhealthy", 12.5, T0)
        _scored(conn, "GPU-ok", "node-8", "healthy", 100.0, T0)
        for n, (state, severity) in enumerate((("open", "critical"), ("open", "critical"),
                                               ("acknowledged", "critical"), ("resolved", "warning"),
                                               ("open", "warning"))):  # fmt: skip
            conn.execute(
                "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at)"
                " VALUES ('GPU-dbe', %s, %s, %s, 's', %s, %s)",
                (f"kind{n}", severity, state, T0, T0))  # fmt: skip
        conn.commit()
        c.refresh(conn, T0)
    s = _series(c)
    key = (("gpu_uuid", "GPU-dbe"), ("hostname", "node-7"))
    assert s["gpuhealth_gpu_state"][key] == 2
    assert s["gpuhealth_gpu_health_score"][key] == 12.5
    assert s["gpuhealth_gpu_subsystem_state"][(*key, ("subsystem", "memory"))] == 2
    assert s["gpuhealth_gpu_subsystem_state"][(*key, ("subsystem", "thermal"))] == 0
    alerts = s["gpuhealth_gpu_open_alerts"]
    assert alerts[(*key, ("severity", "critical"))] == 2  # the acknowledged one is silenced
    assert alerts[(*key, ("severity", "warning"))] == 1  # the resolved one is gone
    assert alerts[(("gpu_uuid", "GPU-ok"), ("hostname", "node-8"), ("severity", "critical"))] == 0
    assert s["gpuhealth_verdicts_as_of_seconds"][()] == T0.timestamp()

    # Next cycle scores only GPU-ok: GPU-dbe left the fleet, its series go with it.
    t1 = T0 + timedelta(seconds=30)
    with connect(migrated) as conn:
        _scored(conn, "GPU-ok", "node-8", "healthy", 100.0, t1)
        conn.commit()
        c.refresh(conn, t1)
    s = _series(c)
    assert all("GPU-dbe" not in dict(k).values() for series in s.values() for k in series)
    assert s["gpuhealth_verdicts_gpus"][()] == 1

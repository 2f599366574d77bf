"""Verdict series read from TimescaleDB after a cycle: the cycle's GPUs only, hostnames, open alerts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from evaluation.pipeline import pipeline
from services.scorer.verdict_metrics import VerdictCollector
from shared.contract.models import to_json
from shared.contract.models_health import parse_alert, parse_health_verdict
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.ports import free_port
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO

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
        c.refresh(conn, T0, ["GPU-dbe", "GPU-ok"])
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

    # Next cycle judges only GPU-ok: GPU-dbe left the fleet (or this scorer's share), its series go with it.
    t1 = T0 + timedelta(seconds=30)
    with connect(migrated) as conn:
        _scored(conn, "GPU-ok", "node-8", "healthy", 100.0, t1)
        conn.commit()
        c.refresh(conn, t1, ["GPU-ok"])
    s = _series(c)
    assert all("GPU-dbe" not in dict(k).values() for series in s.values() for k in series)
    assert s["gpuhealth_verdicts_gpus"][()] == 1


def test_the_scorer_process_exposes_the_verdicts_and_names_the_host_in_its_alerts(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    topics = isolated_topics(topic_factory)
    health, alerts = topics.health, topics.alerts
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=1) as p:
        p.inject(node=0, gpu=0, kind="dbe", after_s=300)
        p.run(1200)
        p.settle()
        sick, host = p.gpu(0, 0), p.fleet.nodes[0].hostname
    port = free_port()
    env = {
        **os.environ,
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
        **topics_env(topics),
        "GPUHEALTH_SCORER__GROUP": f"scorer-{topics.events}",  # its own group: never the running stack's
        "GPUHEALTH_SCORER__METRICS_PORT": str(port), "GPUHEALTH_SCORER__AS_OF": "latest",
        "GPUHEALTH_SCORER__INTERVAL_S": "1",
    }  # fmt: skip
    scorer = subprocess.Popen([sys.executable, "-m", "services.scorer"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert scorer.stdout is not None
        for line in scorer.stdout:  # one full cycle
            if '"msg": "cycle"' in line:
                break
        exposed = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        scorer.send_signal(signal.SIGTERM)
        assert scorer.wait(30) == 0
    finally:
        scorer.kill()
    families = {f.name: f for f in text_string_to_metric_families(exposed)}
    memory = {
        s.labels["gpu_uuid"]: (s.labels["hostname"], s.value)
        for s in families["gpuhealth_gpu_subsystem_state"].samples
        if s.labels["subsystem"] == "memory"
    }
    assert memory[sick] == (host, 2)
    assert len(memory) == 2
    opened = [to_json(parse_alert(m.value() or b"")) for m in consume_all(kafka_settings, alerts, expected=2)]
    assert {a["kind"] for a in opened if a["gpu_uuid"] == sick} >= {"unhealthy_memory"}
    assert {a["hostname"] for a in opened} == {host}
    changes = [
        to_json(parse_health_verdict(m.value() or b""))
        for m in consume_all(kafka_settings, health, expected=2)
    ]
    assert {c["hostname"] for c in changes} == {host}

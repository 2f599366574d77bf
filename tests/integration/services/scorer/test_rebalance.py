"""Scorer processes sharing the fleet by Kafka's partitions: one joins, one is killed, and the test counts.

Real `python -m services.scorer` processes in one consumer group on the test's
gpu-events (6 partitions), over one database. Every GPU carries a finding that
keeps it judged every cycle (an XID 13, degraded for an hour), and the test
watches each GPU's status line: no GPU may go unjudged longer than two
intervals, not when a third scorer joins, not when one of the three is killed
with SIGKILL. XID 79s are produced at random GPUs throughout, the kill
included: each becomes exactly one alert in the database and at most one
`opened` on gpu-alerts.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from shared.contract.models_health import parse_alert
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.scorer_fleet import add_fleet, event_message
from tests.paths import REPO

INTERVAL_S = 10.0
SESSION_S = 6.0  # the broker's least (group.min.session.timeout.ms)
GPUS = 48
FAULTS = 12


def _fleet(db: DatabaseSettings) -> list[str]:
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(GPUS)]
    with connect(db) as conn:
        add_fleet(conn, gpus, datetime.now(UTC))
        for g in gpus:  # a finding that keeps each GPU judged every cycle: an XID 13, degraded for an hour
            conn.execute(
                "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
                " VALUES (now(), %s, 'xid', 'node-0', 'mock', 'test', '{\"xid\": 13}')",
                (g,),
            )
        report(conn)
        conn.commit()
    return gpus


def report(conn: psycopg.Connection[Any]) -> None:
    """Every GPU reports a sample now, as the sink would store it (its newest also in gpu_latest)."""
    conn.execute(
        "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, source, collector_id)"
        " SELECT now(), gpu_uuid, hostname, 'mock', 'test' FROM gpu_assets"
    )
    conn.execute("UPDATE gpu_latest SET time = now()")


class Watch:
    """Polls every GPU's status line and keeps, per GPU, the longest time between two judgements."""

    def __init__(self, db: DatabaseSettings, gpus: list[str]) -> None:
        self.db, self.gpus = db, gpus
        self.last: dict[str, datetime] = {}
        self.longest: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with connect(self.db, autocommit=True) as conn:
            while not self.stop.wait(0.5):
                report(conn)
                for g, at in _statuses(conn):
                    self.judged(g, at)

    def judged(self, gpu: str, at: datetime) -> None:
        before = self.last.get(gpu)
        if before is not None and at > before:
            self.longest[gpu] = max(self.longest.get(gpu, 0.0), (at - before).total_seconds())
        if before is None or at > before:
            self.last[gpu] = at

    def worst(self, now: datetime) -> tuple[float, str]:
        """The longest a GPU went unjudged, the time since its last judgement counted."""
        gaps = {g: max(self.longest.get(g, 0.0), (now - self.last[g]).total_seconds()) for g in self.last}
        g = max(gaps, key=gaps.__getitem__)
        return gaps[g], g


def _scorer(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.scorer"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def test_a_scorer_joining_and_one_killed_leave_no_gpu_unjudged_and_no_alert_twice(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    events, alerts = topic_factory(partitions=6, prefix="events"), topic_factory(prefix="alerts")
    gpus = _fleet(migrated)
    env = {
        **os.environ,
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
        "GPUHEALTH_TOPICS__EVENTS": events, "GPUHEALTH_TOPICS__ALERTS": alerts,
        "GPUHEALTH_TOPICS__HEALTH": topic_factory(prefix="health"),
        "GPUHEALTH_SCORER__GROUP": f"scorer-{events}", "GPUHEALTH_SCORER__INTERVAL_S": str(INTERVAL_S),
        "GPUHEALTH_SCORER__SESSION_TIMEOUT_S": str(SESSION_S), "GPUHEALTH_SCORER__METRICS_PORT": "0",
    }  # fmt: skip
    producer = JsonProducer(make_producer(kafka_settings, {"linger.ms": 0}))
    faulted = random.sample(gpus, FAULTS)
    watch = Watch(migrated, gpus)
    scorers = [_scorer(env, tmp_path / f"scorer-{i}.log") for i in range(2)]
    try:
        deadline = time.monotonic() + 90
        while len(watch.last) < GPUS:  # both up, every GPU judged once
            assert time.monotonic() < deadline, f"not every GPU was judged; logs in {tmp_path}"
            with connect(migrated) as conn:
                for g, at in _statuses(conn):
                    watch.judged(g, at)
            time.sleep(0.5)
        watch.thread.start()
        plan = [("fault", g) for g in faulted[:4]] + [("join", "")] + [("fault", g) for g in faulted[4:8]]
        plan += [("kill", "")] + [("fault", g) for g in faulted[8:]]
        for step, gpu in plan:
            if step == "fault":
                producer.produce(events, gpu, event_message(gpu, "xid", {"xid": 79}, datetime.now(UTC)))
                producer.poll(0)
                time.sleep(1.5)
            elif step == "join":
                scorers.append(_scorer(env, tmp_path / "scorer-2.log"))
                time.sleep(1.5 * INTERVAL_S)
            else:
                scorers[0].send_signal(signal.SIGKILL)
                time.sleep(1.0)
        assert producer.flush(10) == 0
        time.sleep(2 * INTERVAL_S)
        worst, which = watch.worst(datetime.now(UTC))
    finally:
        watch.stop.set()
        for p in scorers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in scorers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert scorers[0].returncode == -signal.SIGKILL
    assert [p.returncode for p in scorers[1:]] == [0, 0], f"logs in {tmp_path}"
    assert worst <= 2 * INTERVAL_S, f"{which} went {worst:.1f} s unjudged; logs in {tmp_path}"
    with connect(migrated) as conn:
        rows = conn.execute("SELECT gpu_uuid, kind, state FROM gpu_alerts").fetchall()
    # one per finding, none lost (changed by issue 32: GPUs of one host faulted together are a node_fault too)
    assert sorted(r for r in rows if str(r[1]).startswith("unhealthy_")) == sorted(
        (g, "unhealthy_xid", "open") for g in faulted
    )
    opened = [parse_alert(m.value() or b"").model_dump() for m in consume_all(kafka_settings, alerts, FAULTS)]
    per_finding = [(a["gpu_uuid"], a["kind"]) for a in opened if a["state"] == "open"]
    assert len(per_finding) == len(set(per_finding))  # never a second `opened`
    # A process killed between its commit and its publish takes that one message with it; no more.
    assert len(per_finding) >= FAULTS - 1


def _statuses(conn: psycopg.Connection[Any]) -> list[tuple[str, datetime]]:
    """Every GPU's last judgement: (gpu_uuid, when its status line was written)."""
    found = conn.execute("SELECT gpu_uuid, updated_at FROM gpu_status").fetchall()
    return [(str(g), at) for g, at in found if isinstance(at, datetime)]

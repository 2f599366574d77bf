"""The lifecycle service on a real pipeline's tables: every GPU decided, stored, published; SIGTERM-clean.

A mock fleet runs through the collector, Kafka and the sink into the test's
schema and is scored once; then the service decides with the operator's
inventory file (one good row, one refused) and what the remediator recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from evaluation.pipeline import pipeline, wait_until
from services.lifecycle.loop import LifecycleLoop
from services.lifecycle.settings import LifecycleSection, LifecycleSettings
from shared.contract.models_lifecycle import parse_lifecycle_decision
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.service_process import service_process, sigterm
from tests.helpers.topics import isolated_topics, topics_env


def _inventory(path: Path, failed: str, healthy: str) -> Path:
    ends = date.today() + timedelta(days=400)
    path.write_text(
        "serial,gpu_uuid,purchase_date,purchase_price,warranty_end,rma_turnaround_days,spares_on_hand,note\n"
        f",{failed},2025-01-10,30000,{ends},21,0,bought with the rack\n"
        f",{healthy},2031-01-01,-5,,,,a typo\n"
    )
    return path


def _remediated(db: DatabaseSettings, gpu: str, at: datetime) -> None:
    """What the remediator writes when it resets a GPU (schema/0030): a decision and the plan it ran."""
    with connect(db) as conn:
        conn.execute(
            "INSERT INTO remediation_decisions (decision_key, decided_at, gpu_uuid, node, action, outcome,"
            " dry_run) VALUES ('k1', %s, %s, 'n0', 'reset_gpu', 'act', false)",
            (at, gpu),
        )
        conn.execute(
            "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, dry_run, decision_key,"
            " created_at, updated_at, next_at) VALUES ('n0', %s, 'reset_gpu', 'xid', %s, 'done', false, 'k1',"
            " %s, %s, %s)",
            ([gpu], ["reset_gpu", "validate"], at, at, at),
        )


def test_a_run_decides_every_gpu_stores_and_publishes_it_with_its_inputs(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    topics = isolated_topics(topic_factory)
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=1) as p:
        failed, healthy = p.gpu(0, 0), p.gpu(0, 1)
        p.inject(node=0, gpu=0, kind="dbe", after_s=300)
        p.run(1200)
        p.score()
    now = datetime.now(UTC)
    _remediated(migrated, failed, now - timedelta(days=2))
    settings = LifecycleSettings(
        kafka=kafka_settings,
        db=migrated,
        topics=topics,
        lifecycle=LifecycleSection(inventory_file=_inventory(tmp_path / "inv.csv", failed, healthy)),
    )
    registry = CollectorRegistry()
    loop = LifecycleLoop(settings, producer=JsonProducer(make_producer(kafka_settings)), registry=registry)
    result = loop.run_once("once", at=now)
    assert result is not None
    assert loop.producer.flush(30) == 0

    with connect(migrated) as conn:
        rows: dict[str, Any] = {
            str(r[0]): r[1:]
            for r in conn.execute(
                "SELECT gpu_uuid, decision, terms, missing, expected_cost FROM lifecycle_decisions"
                " WHERE time = %s",
                (now,),
            )
        }
        run = conn.execute(
            "SELECT trigger, gpus, inventory_rows, inventory_problems, missing_inputs FROM lifecycle_runs"
        ).fetchall()
        problems: list[Any] = conn.execute(
            "SELECT line, problem FROM lifecycle_inventory_problems"
        ).fetchall()
        stored = conn.execute("SELECT line, gpu_uuid, purchase_price FROM lifecycle_inventory").fetchall()
    assert set(rows) == {failed, healthy}
    decision, terms, _, cost = rows[failed]
    said = {t["name"]: (t["value"], t["source"]) for t in terms}
    assert said["failed"] == (True, "scorer")
    assert said["resets_30d"] == (1, "remediation")  # the reset the remediator recorded
    assert said["purchase_price"] == (30000.0, "inventory")
    assert decision in ("reset", "rma"), decision
    assert cost is not None
    assert {t["name"] for t in rows[healthy][1]} >= {"utilisation", "power_w", "warranty_days_left"}
    # a score is priced through the committed calibration, which each decision names
    for _, decided_terms, _, _ in rows.values():
        named = {t["name"]: t for t in decided_terms}
        if "p_fail_30d_score" in named:
            assert named["calibration"]["source"] == "calibration"
            assert named["calibration"]["value"].startswith("predictor-calibration.toml (")
    # the healthy GPU's inventory row was refused: its decision prices what it lacks and says so
    assert any("no inventory row" in m["input"] for m in rows[healthy][2])
    assert run == [("once", 2, 1, 1, [])]  # the remediation history was there to read
    assert problems[0][0] == 3
    assert "purchase_date 2031-01-01 is in the future" in problems[0][1]
    assert "purchase_price -5: negative" in problems[0][1]
    assert stored == [(2, failed, 30000.0)]

    published = [
        parse_lifecycle_decision(m.value() or b"") for m in consume_all(kafka_settings, topics.lifecycle, 2)
    ]
    assert {(m.gpu_uuid, m.decision) for m in published} == {(u, r[0]) for u, r in rows.items()}
    assert registry.get_sample_value("gpuhealth_lifecycle_runs_total", {"trigger": "once"}) == 1


def test_without_the_inventory_or_the_remediators_history_every_decision_says_so(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    topics = isolated_topics(topic_factory)
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=1, hours_back=1) as p:
        p.run(600)
        p.score()
    broken = tmp_path / "inv.csv"
    broken.write_text("serial,waranty_end\n")
    settings = LifecycleSettings(
        kafka=kafka_settings, db=migrated, topics=topics, lifecycle=LifecycleSection(inventory_file=broken)
    )
    loop = LifecycleLoop(
        settings, producer=JsonProducer(make_producer(kafka_settings)), registry=CollectorRegistry()
    )
    result = loop.run_once("once")
    assert result is not None
    (fleet_missing,) = [result.run["missing_inputs"]]
    assert [m["input"] for m in fleet_missing] == ["the inventory", "the remediation history"]
    assert "unknown column(s) 'waranty_end'" in fleet_missing[0]["why"]
    (row,) = result.rows
    inputs = [m["input"] for m in row["missing"]]
    assert "the remediation history (resets in the last 30 days)" in inputs
    assert "the warranty's end (the GPU has no inventory row)" in inputs
    with connect(migrated) as conn:
        assert conn.execute("SELECT line FROM lifecycle_inventory_problems").fetchall() == [(0,)]


def test_the_service_decides_at_start_and_when_the_inventory_changes_and_stops_on_sigterm(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    topics = isolated_topics(topic_factory)
    inventory = tmp_path / "inv.csv"
    inventory.write_text("serial,gpu_uuid\n")
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__HOST": migrated.host,
        "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": str(migrated.search_path),
        **topics_env(topics),
        "GPUHEALTH_LIFECYCLE__METRICS_PORT": "0",
        "GPUHEALTH_LIFECYCLE__INVENTORY_FILE": str(inventory),
        "GPUHEALTH_LIFECYCLE__CHECK_EVERY_S": "0.2",
    }

    def runs() -> list[str]:
        with connect(migrated) as conn:
            return [str(t) for (t,) in conn.execute("SELECT trigger FROM lifecycle_runs ORDER BY time")]

    with service_process("lifecycle", env) as proc:
        wait_until(lambda: runs() == ["start"], 60, "the run at start")
        time.sleep(0.5)
        inventory.write_text("serial,gpu_uuid\nS1,\n")
        wait_until(lambda: runs() == ["start", "inventory"], 60, "a run on the inventory's change")
        out = sigterm(proc, timeout_s=30)
    assert any(json.loads(line).get("msg") == "run" for line in out.splitlines() if line.startswith("{"))

"""`python -m services.remediator` on the real broker and database: verdicts in, a dry run's record out
on gpu-remediations; SIGTERM exits 0; a second reading of the same verdicts (a restart, a new group)
decides nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from evaluation.pipeline import wait_until
from shared.contract.models import to_json
from shared.contract.models_health import AlertResolved
from shared.contract.models_remediation import parse_remediation
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.ports import free_port
from tests.helpers.remediation import (
    add_fleet,
    gpu_uuid,
    node_name,
    rows,
    score,
    scorer_key,
    service_env,
    verdict_finding,
)
from tests.helpers.service_process import service_process, sigterm


def messages_read(port: int) -> float:
    """What the service's /metrics says it read (decided, needing no decision, or refused)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return 0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpuhealth_remediator_messages"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_the_service_decides_records_and_publishes_once(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    health, alerts, out = (
        topic_factory(prefix="health"),
        topic_factory(prefix="alerts"),
        topic_factory(prefix="rem"),
    )
    add_fleet(migrated, 30)  # the breaker's 10 % of the fleet: 3 nodes
    port, key, now = free_port(), scorer_key(tmp_path / "keys"), datetime.now(UTC)
    with JsonProducer(make_producer(kafka_settings)) as producer:
        for node in range(3):
            finding = verdict_finding(node, at=now)
            key.produce(producer, health, finding.gpu_uuid, finding.message)
        again = verdict_finding(0, at=now)  # the same verdict, again
        key.produce(producer, health, gpu_uuid(0, 0), again.message)
        producer.produce(health, "x", {"schema_version": 1, "hostile": "\u0000"})  # refused, never blocks
        resolved = AlertResolved(
            time=now, alert_id=1, gpu_uuid=gpu_uuid(1, 0), hostname="", kind="thermal", state="resolved"
        )
        key.produce(producer, alerts, resolved.gpu_uuid, to_json(resolved))
    topics = {"health": health, "alerts": alerts, "remediations": out}
    env = service_env(kafka_settings, migrated, topics, port=port, trusted=key.trusted)
    env["GPUHEALTH_REMEDIATOR__DRAIN_LOOK_S"] = "0.05"
    with service_process("remediator", env) as proc:
        # a dry run's plan validates as long as the live one would: until its scoring cycles have passed
        at_validate = "SELECT count(*) FROM remediations WHERE steps[step + 1] = 'validate'"
        wait_until(lambda: rows(migrated, at_validate) == [(3,)], 90, "three plans validating")
        cycles = iter(range(1, 10_000))
        done = "SELECT count(*) FROM remediations WHERE state = 'done'"

        def cycle_then_done() -> bool:  # a scoring cycle of the three nodes, then: are the plans done?
            at = datetime.now(UTC) + timedelta(seconds=next(cycles))
            for node in range(3):
                score(migrated, node_name(node), at)
            return rows(migrated, done) == [(3,)]

        wait_until(cycle_then_done, 90, "three plans done")
        # 3 decisions and 3 plans of 5 dry-run steps each (a reset and its remedy), its validation's
        # records and their outcomes; and the refusal of the unsigned message
        ((expected,),) = rows(migrated, "SELECT count(*) FROM remediation_events")
        assert expected >= 3 * (1 + 6 + 2 + 1) + 1
        records = [
            parse_remediation(m.value() or b"") for m in consume_all(kafka_settings, out, expected, 60)
        ]
        wait_until(lambda: messages_read(port) >= 6, 30, "the refused message counted: it blocked nothing")
        out_text = sigterm(proc)
    assert "dry run: every decision and step is recorded" in out_text
    assert len(records) == expected
    assert {r.dry_run for r in records} == {True}
    (refusal,) = [r for r in records if r.kind == "refusal"]
    assert (refusal.status, refusal.node, refusal.response["reason"]) == ("refused", "", "unsigned")
    assert sorted(r.node for r in records if r.kind == "decision") == [
        "gpu-node-00",
        "gpu-node-01",
        "gpu-node-02",
    ]
    assert rows(migrated, "SELECT count(*) FROM remediation_events WHERE NOT published") == [(0,)]
    # the same topics read again from the start by another group: every decision is there already
    env["GPUHEALTH_REMEDIATOR__GROUP_ID"] = f"rem-{uuid.uuid4().hex[:8]}"
    with service_process("remediator", env) as proc:
        wait_until(lambda: messages_read(port) >= 6, 60, "every verdict and alert read again")
        sigterm(proc)
    assert rows(migrated, "SELECT count(*) FROM remediation_decisions") == [(3,)]
    # nothing decided again; the unsigned message refused again (a refusal is recorded each time it is read)
    assert rows(migrated, "SELECT count(*) FROM remediation_events") == [(expected + 1,)]
    assert len({r.record_id for r in records}) == expected

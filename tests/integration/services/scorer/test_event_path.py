"""The event fast path on the real broker and database: an event is an alert on gpu-alerts at once, once.

The scorer (its cycle and its event path, as `python -m services.scorer` runs
them) joins its own group on the test's gpu-events topic; an XID 79 and a DBE
are produced for two GPUs as a collector would. Their alerts arrive on the
test's gpu-alerts long before the cycle's interval, are in the database, and a
cycle after them opens nothing more. A message the contract refuses is counted
and skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from evaluation.pipeline import wait_until
from services.scorer.build import Scorer, build_scorer
from services.scorer.settings import ScorerSection, ScorerSettings
from shared.contract.models import SCHEMA_VERSION
from shared.contract.models_health import parse_alert
from shared.contract.signing import Keyring, SigningSettings
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import running
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.kafka import consume_all
from tests.helpers.remediation import ScorerKey, scorer_key
from tests.helpers.scorer_fleet import add_fleet, event_message
from tests.helpers.topics import isolated_topics

INTERVAL_S = 60.0  # far beyond what the fast path may take: its alerts cannot be the cycle's


def fleet(db: DatabaseSettings, n: int) -> list[str]:
    """`n` GPUs in the inventory, reporting now (so the cycle finds nothing wrong with them)."""
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(n)]
    with connect(db) as conn:
        add_fleet(conn, gpus, datetime.now(UTC))
    return gpus


@dataclass
class Running:
    scorer: Scorer
    registry: CollectorRegistry
    topics: TopicSettings
    key: ScorerKey

    def sample(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0


@pytest.fixture
def scorer(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> Iterator[Running]:
    topics, key = isolated_topics(topic_factory, events=6), scorer_key(tmp_path / "keys")
    settings = ScorerSettings(
        kafka=kafka_settings, db=migrated, topics=topics,
        scorer=ScorerSection(as_of="now", interval_s=INTERVAL_S, group=f"scorer-{uuid.uuid4().hex[:8]}",
                             signing=SigningSettings(private_key_file=key.signer_file)),
    )  # fmt: skip
    registry = CollectorRegistry()
    built = build_scorer(settings, registry=registry)
    assert built.events is not None
    with running(built.events, name="events") as stop, running(built.cycle, name="cycle", stop=stop):
        up = Running(built, registry, topics, key)
        wait_until(lambda: built.cycle.ownership.share.partitions == set(range(6)), 60, "all partitions")
        wait_until(lambda: up.sample("gpuhealth_scorer_cycles_total") >= 1, 60, "a cycle")
        yield up


def test_an_event_is_its_alert_at_once_and_once(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, scorer: Running
) -> None:
    xid_gpu, dbe_gpu, *_ = fleet(migrated, 4)
    scorer.scorer.cycle.score_once()  # the new GPUs judged healthy before their events
    producer = JsonProducer(make_producer(kafka_settings, {"linger.ms": 0}))
    sent, now = time.monotonic(), datetime.now(UTC)
    producer.produce(scorer.topics.events, xid_gpu, event_message(xid_gpu, "xid", {"xid": 79}, now))
    dbe = event_message(dbe_gpu, "ecc_dbe", {"increment": 1, "total": 1}, now)
    producer.produce(scorer.topics.events, dbe_gpu, dbe)
    producer.produce(scorer.topics.events, dbe_gpu, {"schema_version": SCHEMA_VERSION, "kind": "nonsense"})
    assert producer.flush(10) == 0
    opened = consume_all(kafka_settings, scorer.topics.alerts, expected=2, timeout_s=INTERVAL_S / 2)
    took = time.monotonic() - sent
    alerts = [parse_alert(m.value() or b"").model_dump() for m in opened]
    keyring = Keyring.load(scorer.key.trusted)  # the fast path signs what it publishes, as the cycle does
    for m in opened:
        signed = keyring.verify(topic=str(m.topic()), key=m.key(), value=m.value(), headers=m.headers())
        assert signed.kid == scorer.key.signer.kid
    assert {(a["gpu_uuid"], a["kind"], a["state"]) for a in alerts} == {
        (xid_gpu, "unhealthy_xid", "open"),
        (dbe_gpu, "unhealthy_memory", "open"),
    }
    assert took < INTERVAL_S / 2  # the fast path's, not the next cycle's (generous: a loaded CI machine)
    wait_until(lambda: scorer.sample("gpuhealth_scorer_events_refused_total") == 1, 30, "the refusal")
    assert scorer.sample("gpuhealth_scorer_events_total") == 2
    assert scorer.sample("gpuhealth_scorer_event_to_verdict_seconds_count") == 2

    # The cycle sees what the fast path saw: it agrees, and opens nothing more.
    again = scorer.scorer.cycle.score_once()
    assert again is not None
    assert (again.alerts_opened, again.alerts_resolved) == (0, 0)
    with connect(migrated) as conn:
        rows = conn.execute("SELECT gpu_uuid, kind, state FROM gpu_alerts ORDER BY id").fetchall()
        stored = conn.execute("SELECT count(*) FROM gpu_events").fetchone()
    assert sorted(rows) == sorted([(xid_gpu, "unhealthy_xid", "open"), (dbe_gpu, "unhealthy_memory", "open")])
    assert stored == (2,)  # the fast path stored the events it judged
    later = consume_all(kafka_settings, scorer.topics.alerts, expected=3, timeout_s=3)
    assert len(later) == 2  # no second `opened`

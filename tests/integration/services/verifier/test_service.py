"""The audit chain through the real broker (tampered records too), stored by the sink, served by the API."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import ConfigResource
from prometheus_client import CollectorRegistry

from services.sink.metrics import SinkMetrics
from services.sink.verifications import VerificationLoop
from services.verifier import __main__ as cli
from services.verifier.chainlog import KafkaChain, MemoryChain, audit_topic
from shared.contract.chain import link_of
from shared.contract.models_verify import Outcome, RecordKind, record_bytes, record_json
from shared.gpu.gpu_identity import NvmlReader
from shared.plumbing.db import connect
from shared.plumbing.kafka import make_admin, make_consumer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.identities import as_role
from tests.helpers.kafka import consume_all, header_map
from tests.helpers.topics import isolated_topics
from tests.helpers.verifier_fakes import UUIDS, FakeNvml


def check(gpu: str, name: str = "matmul", outcome: Outcome = Outcome.PASS) -> dict[str, Any]:
    return {
        "kind": RecordKind.COMPUTE_CHECK,
        "gpu_uuid": gpu,
        "hostname": "node-1",
        "verifier_id": "node-1",
        "name": name,
        "device": "cuda:0",
        "outcome": outcome,
        "device_ms": 0.35,
        "cpu_ms": 15.0,
        "speedup": 42.9,
    }


def produce_raw(settings: KafkaSettings, topic: str, items: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = make_producer(settings)
    for key, value in items:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


@pytest.fixture
def audit_topic_name(topic_factory: Callable[..., str]) -> str:
    return topic_factory(partitions=3, prefix="verifications")


@pytest.fixture
def kafka_env(kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> KafkaSettings:
    monkeypatch.setenv("GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    return kafka_settings


def test_chain_on_the_broker_is_intact_then_a_forged_record_is_caught(
    kafka_env: KafkaSettings, audit_topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = audit_topic_name
    chain = KafkaChain(kafka_env, topic, partitions=3)
    for i in range(3):
        chain.append(check(UUIDS[0], f"a{i}"))
    for i in range(2):
        chain.append(check(UUIDS[1], f"b{i}"))
    # the topic was brought to the audit log's configuration: kept forever, not compacted
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = make_admin(kafka_env)
    config = admin.describe_configs([resource])[resource].result()
    assert (config["retention.ms"].value, config["cleanup.policy"].value) == ("-1", "delete")

    assert cli.main(["audit", "--topic", topic]) == 0
    out = capsys.readouterr().out
    assert "5 record(s), 2 GPU chain(s)" in out
    assert "INTACT" in out

    # A second writer picks the chain up where it ends, from the topic itself.
    later = KafkaChain(kafka_env, topic, partitions=3)
    record = later.append(check(UUIDS[0], "a3"))
    assert record.seq == 3
    assert record.prev_sha256 == chain.heads[UUIDS[0]].sha256

    # Someone rewrites history: a copy of seq 1 saying the check failed.
    original = next(
        m for m in consume_all(kafka_env, topic, 6) if json.loads(m.value() or b"")["name"] == "a1"
    )
    forged = {**json.loads(original.value() or b""), "outcome": "wrong_result", "reason": "edited"}
    produce_raw(kafka_env, topic, [(UUIDS[0].encode(), json.dumps(forged).encode())])
    (where,) = [
        m for m in consume_all(kafka_env, topic, 7) if json.loads(m.value() or b"").get("reason") == "edited"
    ]

    assert cli.main(["audit", "--topic", topic]) == 1
    out = capsys.readouterr().out
    assert "BROKEN, first broken link: " + UUIDS[0] in out
    assert "does not match the previous record's hash" in out
    assert f"partition {where.partition()} offset {where.offset()}" in out
    report = audit_topic(kafka_env, topic)
    assert [(b.partition, b.offset) for b in report.broken] == [(where.partition(), where.offset())]
    assert report.heads[UUIDS[1]].seq == 1  # the other GPU's chain is untouched


def test_a_record_altered_before_it_reached_the_topic_breaks_the_next_link(
    kafka_env: KafkaSettings, audit_topic_name: str
) -> None:
    """What an edited log looks like when copied or restored: one record's content differs."""
    chain = MemoryChain()
    for i in range(4):
        chain.append(check(UUIDS[0], f"op{i}"))
    values = [record_bytes(r) for r in chain.records]
    edited = json.loads(values[1])
    edited["speedup"] = 99.0
    values[1] = json.dumps(edited).encode()
    produce_raw(kafka_env, audit_topic_name, [(UUIDS[0].encode(), v) for v in values])
    report = audit_topic(kafka_env, audit_topic_name)
    assert [(b.gpu_uuid, b.offset) for b in report.broken] == [(UUIDS[0], 2)]
    assert cli.main(["audit", "--topic", audit_topic_name]) == 1


# ---------------------------------------------------------------- the sink and the API


@pytest.fixture
def record_topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory, verifications=2, systems=2, dead_letters=1)


class Loops:
    """Record loops run on threads, stopped and closed at the end of the test."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings) -> None:
        self.kafka, self.topics = kafka, topics
        self.group = f"test-records-{uuid.uuid4().hex[:8]}"
        self.running: dict[int, tuple[VerificationLoop, threading.Thread]] = {}

    def start(self, db: DatabaseSettings, max_backoff_s: float = 30) -> VerificationLoop:
        loop = VerificationLoop(
            consumer=make_consumer(self.kafka, group_id=self.group),
            dlq_producer=make_producer(self.kafka),
            db=db,
            topics=self.topics,
            group=self.group,
            metrics=SinkMetrics(CollectorRegistry()),
            max_backoff_s=max_backoff_s,
        )
        thread = threading.Thread(target=loop.run, args=(loop.stop,), daemon=True)
        thread.start()
        self.running[id(loop)] = (loop, thread)
        return loop

    def halt(self, loop: VerificationLoop) -> None:
        loop.stop.set()
        self.running[id(loop)][1].join(30)
        loop.consumer.close()
        del self.running[id(loop)]


@pytest.fixture
def loops(kafka_settings: KafkaSettings, record_topics: TopicSettings) -> Iterator[Loops]:
    running = Loops(kafka_settings, record_topics)
    yield running
    for loop, _ in list(running.running.values()):
        running.halt(loop)


def wait_for_rows(db: DatabaseSettings, query: str, expected: int, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        with connect(db) as conn:
            found = int(str(conn.execute(query).fetchone()[0]))  # type: ignore[index]
        if found >= expected or time.monotonic() > deadline:
            return found
        threading.Event().wait(0.2)


def test_sink_stores_records_dead_letters_bad_ones_and_the_api_serves_them(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    served_api: str,
    record_topics: TopicSettings,
    loops: Loops,
) -> None:
    chain = MemoryChain()
    for i in range(3):
        chain.append(check(UUIDS[0], f"op{i}", Outcome.PASS if i else Outcome.TOO_SLOW))
    chain.append(check(UUIDS[1]))
    identity = NvmlReader(FakeNvml()).identity("node-1", "c1")
    newer = NvmlReader(FakeNvml(driver="555.42.02")).identity("node-1", "c1")
    newer = newer.model_copy(update={"time": identity.time + timedelta(seconds=1)})  # the driver upgraded
    good = [(r.gpu_uuid.encode(), record_bytes(r)) for r in chain.records]
    produce_raw(
        kafka_settings,
        record_topics.verifications,
        [
            good[0],
            (UUIDS[0].encode(), b"{garbage"),
            good[1],
            (UUIDS[1].encode(), good[2][1]),
            *good[2:],
        ],
    )
    produce_raw(
        kafka_settings,
        record_topics.systems,
        [
            (b"node-1", json.dumps(record_json(identity)).encode()),
            (b"node-1", b'{"schema_version": 7}'),
            (b"node-1", json.dumps(record_json(newer)).encode()),
        ],
    )
    loop = loops.start(migrated)
    assert wait_for_rows(migrated, "SELECT count(*) FROM gpu_verifications", 4) == 4
    assert wait_for_rows(migrated, "SELECT count(*) FROM gpu_systems", 2) == 2

    dead = consume_all(kafka_settings, record_topics.dead_letters, 3)
    reasons = sorted((header_map(m)["dlq.category"], header_map(m)["dlq.source.topic"]) for m in dead)
    assert reasons == [
        ("contract", record_topics.systems),
        ("contract", record_topics.verifications),
        ("key", record_topics.verifications),
    ]

    with connect(migrated) as conn:
        rows = conn.execute(
            "SELECT seq, sha256, prev_sha256, outcome FROM gpu_verifications "
            "WHERE gpu_uuid = %s ORDER BY seq",
            (UUIDS[0],),
        ).fetchall()
        latest = conn.execute("SELECT record->>'driver_version' FROM gpu_systems_latest").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2]
    assert rows[0][3] == "too_slow"
    assert rows[1][2] == rows[0][1] == link_of(json.loads(good[0][1]))
    assert latest == [("555.42.02",)]

    # a restarted loop resumes from the offsets in the database: nothing twice
    loops.halt(loop)
    again = loops.start(migrated)
    produce_raw(kafka_settings, record_topics.verifications, [good[0]])  # a replay
    chain.append(check(UUIDS[1], "later"))
    produce_raw(
        kafka_settings, record_topics.verifications, [(UUIDS[1].encode(), record_bytes(chain.records[-1]))]
    )
    assert wait_for_rows(migrated, "SELECT count(*) FROM gpu_verifications", 5) == 5
    assert again.generation >= 1

    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        answer = client.get(f"/api/v1/gpus/{UUIDS[0]}/verifications").json()
        assert [v["seq"] for v in answer["verifications"]] == [2, 1, 0]
        assert answer["chain_breaks"] == []
        assert answer["verifications"][2]["record"]["outcome"] == "too_slow"
        passed = client.get(f"/api/v1/gpus/{UUIDS[0]}/verifications", params={"outcome": "pass"}).json()
        assert [v["seq"] for v in passed["verifications"]] == [2, 1]
        systems = client.get("/api/v1/systems").json()["systems"]
        assert [(s["hostname"], s["gpus"], s["driver_version"]) for s in systems] == [
            ("node-1", 2, "555.42.02")
        ]
        detail = client.get("/api/v1/systems/node-1").json()
        assert detail["record"]["gpus"][0]["uuid"] == UUIDS[0]
        history = client.get("/api/v1/systems/node-1/history").json()["history"]
        assert [h["record"]["driver_version"] for h in history] == ["555.42.02", "550.90.07"]
        assert client.get("/api/v1/systems/nowhere").status_code == 404
        assert client.get("/api/v1/systems/a;DROP TABLE x").status_code == 422
        assert client.get("/api/v1/gpus/not-a-uuid/verifications").status_code == 422
        assert client.get(f"/api/v1/gpus/{UUIDS[0]}/verifications", params={"limit": 0}).status_code == 422


def test_records_loop_keeps_retrying_while_the_database_is_away(
    kafka_settings: KafkaSettings, record_topics: TopicSettings, migrated: DatabaseSettings, loops: Loops
) -> None:
    """Nothing is skipped while the database cannot be reached; it is all stored once it is back."""
    chain = MemoryChain()
    record = chain.append(check(UUIDS[0]))
    produce_raw(kafka_settings, record_topics.verifications, [(UUIDS[0].encode(), record_bytes(record))])
    loop = loops.start(migrated.model_copy(update={"port": 1, "connect_timeout_s": 1}), max_backoff_s=1)
    deadline = time.monotonic() + 60
    while loop.metrics.db_retries._value.get() < 2:
        assert time.monotonic() < deadline, "the unreachable database was not retried"
        threading.Event().wait(0.1)
    loop.db = migrated  # the database is back
    assert wait_for_rows(migrated, "SELECT count(*) FROM gpu_verifications", 1) == 1


def test_compute_command_appends_each_gpus_verdict_to_the_chain(
    kafka_env: KafkaSettings,
    audit_topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from services.verifier import backends
    from tests.helpers.verifier_fakes import FakeBackend

    monkeypatch.setattr(backends, "find_backend", lambda name: (FakeBackend(gpus=2, device_ms=1e-6), []))
    args = ["compute", "--topic", audit_topic_name, "--size", "40", "--repeats", "2"]
    assert cli.main(args) == 0
    monkeypatch.setattr(backends, "find_backend", lambda name: (FakeBackend(gpus=2, corrupt=3.0), []))
    assert cli.main(args) == 1  # a wrong result fails the command, and is recorded all the same
    assert f"recorded on {audit_topic_name}: seq 1" in capsys.readouterr().out
    report = audit_topic(kafka_env, audit_topic_name)
    assert report.intact
    assert {u: h.seq for u, h in report.heads.items()} == {UUIDS[0]: 1, UUIDS[1]: 1}
    outcomes = sorted(
        json.loads(m.value() or b"")["outcome"] for m in consume_all(kafka_env, audit_topic_name, 4)
    )
    assert outcomes == ["pass", "pass", "wrong_result", "wrong_result"]

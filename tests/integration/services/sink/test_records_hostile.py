"""Hostile gpu-verifications and gpu-systems records through the real broker into the real database.

The sink's records loop (services/sink/verifications.py) is held to issue #13's
bar like the main loop: whatever a record holds (arbitrary bytes, arbitrary
JSON, deep nesting, NUL and lone surrogates, wrong keys, oversized values,
records the contract accepts and the database refuses through a CHECK this
test adds), the loop stays up, stores every valid record exactly once and
dead-letters every other exactly once (recorded in sink_dead_letters with its
batch and delivered by the relay), also when it is stopped while retrying.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from evaluation.pipeline import stored_offsets_total, wait_until
from services.sink.verifications import VerificationLoop
from shared.chain import GENESIS
from shared.config import DatabaseSettings, KafkaSettings, TopicSettings
from shared.db import connect
from shared.errors import ContractError
from shared.fakes.samples import T0
from shared.gpu_identity import NvmlReader
from shared.kafka import make_consumer, make_producer
from shared.models_verify import SystemIdentity, parse_system, parse_verification, record_json
from tests.helpers.hostile import (
    ANY_JSON,
    ANY_TEXT,
    NUMBERS,
    HostileRun,
    Produced,
    await_dead_letters,
    dead_letter_ledger,
    dead_letters_in_topic,
    deep,
    drain,
    produce,
    records_loop,
)
from tests.helpers.sink import counter_value
from tests.helpers.topics import isolated_topics
from tests.helpers.verifier_fakes import FakeNvml

MAX_BYTES = 8192
REFUSE = "refuse-me"  # a name (verifications) / collector_id (systems) the contract takes and a CHECK refuses
UNSTORABLE = st.sampled_from(["\x00", "\ud800", "\udfff", "a\x00b", "\x07", "\u2028"])
VERIFICATION_TEXT = ["name", "hostname", "verifier_id", "device", "backend", "reason", "gpu_model", "dtype"]
VERIFICATION_NUMBERS = [
    "seq",
    "device_ms",
    "cpu_ms",
    "speedup",
    "max_rel_err",
    "rtol",
    "repeats",
    "gpu_index",
]
SYSTEM_TEXT = ["driver_version", "collector_id", "nvml_version", "cuda_driver_version"]
_IDENTITY = record_json(NvmlReader(FakeNvml()).identity("base", "c1"))


@dataclass
class Draft:
    """A record to produce; 'verification' and 'system' drafts get a unique GPU/host when produced."""

    shape: str  # verification | system | raw
    changes: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    to: str = "verifications"  # for raw drafts: verifications | systems
    key: str = "own"  # own | other | none


valid = st.builds(Draft, shape=st.sampled_from(["verification", "system"]))
verifications = st.builds(
    Draft, shape=st.just("verification"),
    changes=st.dictionaries(st.sampled_from(VERIFICATION_NUMBERS), NUMBERS, max_size=2)
    | st.tuples(st.sampled_from(VERIFICATION_TEXT), ANY_TEXT, UNSTORABLE).map(lambda t: {t[0]: t[1] + t[2]})
    | st.dictionaries(ANY_TEXT, ANY_JSON, max_size=2)
    | st.fixed_dictionaries({"result": ANY_JSON}),
)  # fmt: skip
systems = st.builds(
    Draft, shape=st.just("system"),
    changes=st.tuples(st.sampled_from(SYSTEM_TEXT), ANY_TEXT, UNSTORABLE).map(lambda t: {t[0]: t[1] + t[2]})
    | st.fixed_dictionaries({"gpus": ANY_JSON}) | st.fixed_dictionaries({"identity_sha256": ANY_TEXT}),
)  # fmt: skip
refused_by_db = st.builds(
    Draft, shape=st.sampled_from(["verification", "system"]), changes=st.just({"?": REFUSE})
)
anything = st.builds(
    Draft, shape=st.just("raw"), to=st.sampled_from(["verifications", "systems"]),
    key=st.sampled_from(["other", "none"]), raw=st.binary(max_size=300)
    | ANY_JSON.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    | st.integers(20, 5000).map(lambda n: ('{"schema_version": 1, "gpu_uuid": ' + deep(n) + "}").encode())
    | st.integers(MAX_BYTES, 3 * MAX_BYTES).map(lambda n: b'{"hostname": "' + b"x" * n + b'"}'),
)  # fmt: skip
wrong_key = st.builds(
    Draft, shape=st.sampled_from(["verification", "system"]), key=st.sampled_from(["other", "none"])
)
oversized = st.builds(Draft, shape=st.just("verification"), changes=st.just({"reason": "x" * MAX_BYTES}))
RECORDS = st.lists(
    st.one_of(valid, valid, verifications, systems, refused_by_db, anything, wrong_key, oversized),
    min_size=1,
    max_size=16,
)


class Run(HostileRun):
    """A hostile run over the records loop's topics; a stored row is named by its GPU UUID's or
    hostname's unique suffix."""

    def message(self, draft: Draft, i: int) -> Produced:
        gpu, host = f"GPU-{uuid.uuid4().hex[:8]}-0000-4000-8000-{i:012x}", f"host-{i:012x}"
        topic = self.topics.verifications if draft.to == "verifications" else self.topics.systems
        changes = dict(draft.changes)
        refuse = changes.pop("?", None) == REFUSE
        value: bytes | None
        if draft.shape == "verification":
            topic, own = self.topics.verifications, gpu
            record = {
                "schema_version": 1, "kind": "compute_check", "time": (T0 + timedelta(seconds=i)).isoformat(),
                "gpu_uuid": gpu, "seq": 0, "prev_sha256": GENESIS, "hostname": "node-1",
                "verifier_id": "node-1", "name": REFUSE if refuse else "matmul", "device": "cuda:0",
                "outcome": "pass", **changes,
            }  # fmt: skip
            value = _dumps(record)
        elif draft.shape == "system":
            topic, own = self.topics.systems, host
            record = {**_IDENTITY, "hostname": host, "collector_id": REFUSE if refuse else "c1"}
            record["time"] = (T0 + timedelta(seconds=i)).isoformat()
            record["identity_sha256"] = SystemIdentity.identity_digest(record)
            record.update(changes)  # after the hash: a forged identity is refused
            value = _dumps(record)
        else:
            own, value = host, draft.raw
        key = {"own": own.encode(), "other": b"someone-else", "none": None}[draft.key]
        accepted = _accepted(topic == self.topics.verifications, value, key, own)
        return Produced(topic, key, value, f"{i:012x}", accepted)


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _accepted(is_verification: bool, raw: bytes | None, key: bytes | None, own: str) -> bool:
    """The contract's verdict (and the test's CHECK): the record must be stored."""
    if raw is None or len(raw) > MAX_BYTES or key != own.encode():
        return False
    try:
        if is_verification:
            return parse_verification(raw).name != REFUSE
        return parse_system(raw).collector_id != REFUSE
    except ContractError:
        return False


def stored_names(db: DatabaseSettings, suffixes: set[str]) -> list[str]:
    """The suffixes (of GPU UUIDs and hostnames) of the rows stored, once per row."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT right(gpu_uuid, 12) FROM gpu_verifications WHERE right(gpu_uuid, 12) = ANY(%s)"
            " UNION ALL SELECT right(hostname, 12) FROM gpu_systems WHERE right(hostname, 12) = ANY(%s)",
            (list(suffixes), list(suffixes)),
        ).fetchall()
    return [str(r[0]) for r in rows]


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory, verifications=2, systems=2, dead_letters=2)


@pytest.fixture
def refusing(migrated: DatabaseSettings) -> DatabaseSettings:
    """The database refuses what the contract accepts: a CHECK on each table the loop writes."""
    with connect(migrated) as conn:
        conn.execute(f"ALTER TABLE gpu_verifications ADD CONSTRAINT refused_here CHECK (name <> '{REFUSE}')")
        conn.execute(
            "ALTER TABLE gpu_systems ADD CONSTRAINT refused_here"
            f" CHECK (record->>'collector_id' IS DISTINCT FROM '{REFUSE}')"
        )
        conn.commit()
    return migrated


def verification_loop(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str
) -> VerificationLoop:
    return records_loop(VerificationLoop, kafka, db, topics, group, max_message_bytes=MAX_BYTES)


@pytest.fixture
def running() -> Iterator[Callable[[VerificationLoop], threading.Thread]]:
    started: list[tuple[VerificationLoop, threading.Thread]] = []

    def start(loop: VerificationLoop) -> threading.Thread:
        thread = threading.Thread(target=loop.run, args=(loop.stop,), daemon=True)
        thread.start()
        started.append((loop, thread))
        return thread

    yield start
    for loop, thread in started:
        loop.stop.set()
        thread.join(60)
        with contextlib.suppress(RuntimeError):  # closed by the test already
            loop.consumer.close()


def test_hostile_records_never_stop_the_records_loop_and_each_ends_up_in_exactly_one_place(
    kafka_settings: KafkaSettings,
    refusing: DatabaseSettings,
    topics: TopicSettings,
    running: Callable[[VerificationLoop], threading.Thread],
) -> None:
    group = f"records-{uuid.uuid4().hex[:8]}"
    dlq = make_consumer(kafka_settings, group_id=f"read-{group}")
    dlq.subscribe([topics.dead_letters])
    run = Run(topics, refusing, group, make_producer(kafka_settings), dlq)
    loop = verification_loop(kafka_settings, refusing, topics, group)

    @settings(
        max_examples=25, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(drafts=RECORDS)
    @example(drafts=[Draft("verification", {"?": REFUSE}), Draft("verification"), Draft("system")])
    @example(drafts=[Draft("system", {"?": REFUSE}), Draft("system"), Draft("verification")])
    @example(drafts=[Draft("raw", raw=f'{{"schema_version": 1, "x": {deep(3000)}}}'.encode(), to=t) for t in
                     ("verifications", "systems")] + [Draft("verification")])  # fmt: skip
    @example(drafts=[Draft("verification", {"name": "a\x00"}), Draft("system", {"driver_version": "\ud800"})])
    def one_example(drafts: list[Draft]) -> None:
        must_store, must_die = produce(run, drafts)
        wait_until(lambda: stored_offsets_total(refusing, group) == run.n, 60, "every record's offset stored")
        assert thread.is_alive(), "the records loop stopped"
        stored = stored_names(refusing, {f"{i:012x}" for i in range(run.n - len(drafts) + 1, run.n + 1)})
        assert sorted(stored) == sorted(must_store)  # each valid record once, no invalid one
        run.stored += len(stored)
        await_dead_letters(run, must_die)

    thread = running(loop)
    try:
        one_example()
    finally:
        dlq.close()
    undelivered, refused = dead_letter_ledger(refusing, group)
    assert undelivered == 0  # nothing left to send again after a restart
    assert refused >= 2  # the examples above: one refused by each table's CHECK
    assert counter_value(loop.metrics.dead_letters) == len(run.dead)
    print(f"\nrecords hostile run: tried={run.n} stored={run.stored} dead-lettered={len(run.dead)} crashes=0")
    assert run.stored + len(run.dead) == run.n


def test_stopped_while_retrying_then_restarted_each_record_is_stored_or_dead_lettered_once(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topics: TopicSettings,
    running: Callable[[VerificationLoop], threading.Thread],
) -> None:
    """SIGTERM (the stop event) while a batch is retried: nothing of it is stored or delivered and no
    offset moves; the next run stores the valid records once and dead-letters the bad one once."""
    group = f"records-{uuid.uuid4().hex[:8]}"
    run = Run(
        topics, migrated, group, make_producer(kafka_settings), make_consumer(kafka_settings, group_id=group)
    )
    with connect(migrated) as conn:  # a failure that is not the records' fault: retried, never split
        conn.execute("ALTER TABLE gpu_systems RENAME TO gpu_systems_away")
        conn.commit()
    must_store, must_die = produce(
        run, [Draft("verification"), Draft("raw", raw=b"{garbage"), Draft("system")]
    )
    first = verification_loop(kafka_settings, migrated, topics, group)
    thread = running(first)
    wait_until(lambda: counter_value(first.metrics.db_retries) >= 3, 60, "retries of the batch")
    first.stop.set()
    thread.join(60)
    assert not thread.is_alive()
    first.consumer.close()  # it leaves the group at once
    assert stored_offsets_total(migrated, group) == 0
    assert dead_letters_in_topic(kafka_settings, topics.dead_letters) == 0
    with connect(migrated) as conn:
        conn.execute("ALTER TABLE gpu_systems_away RENAME TO gpu_systems")
        conn.commit()

    second = verification_loop(kafka_settings, migrated, topics, group)
    second_thread = running(second)
    wait_until(lambda: stored_offsets_total(migrated, group) == run.n, 60, "every record's offset stored")
    assert sorted(stored_names(migrated, must_store)) == sorted(must_store)
    second.stop.set()
    second_thread.join(60)  # its relay has delivered and flushed everything it was going to
    assert dead_letters_in_topic(kafka_settings, topics.dead_letters) == 1

    reader = make_consumer(kafka_settings, group_id=f"read-{group}")
    reader.subscribe([topics.dead_letters])
    run.dlq = reader
    try:
        wait_until(lambda: drain(run) >= 1, 60, "the dead letter")
    finally:
        reader.close()
    assert run.dead_seen == sorted(must_die)

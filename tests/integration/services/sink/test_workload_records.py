"""The workload loop is the records loop: hostile gpu-processes and llm-sessions, real broker and database.

Whatever a record holds (arbitrary bytes or JSON, hostile text in its labels,
a wrong key, an oversized value, a value the contract takes and a CHECK this
test adds refuses), the loop stays up, stores every valid record exactly once,
splits a record PostgreSQL refuses out of its batch while storing the rest,
and dead-letters every other record exactly once (recorded with its batch,
delivered by the relay), also across a stop while a batch is retried; its lag
is on /metrics as gpuhealth_sink_lag.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from evaluation.pipeline import stored_offsets_total, wait_until
from services.sink.workload import WorkloadLoop
from shared.config import DatabaseSettings, KafkaSettings, TopicSettings
from shared.db import connect
from shared.errors import ContractError
from shared.fakes.samples import T0
from shared.kafka import make_consumer, make_producer
from shared.models_workload import LlmSession, parse_gpu_processes, parse_llm_message
from tests.helpers.hostile import (
    HostileRun,
    Produced,
    await_dead_letters,
    dead_letter_ledger,
    dead_letters_in_topic,
    produce,
    records_loop,
)
from tests.helpers.sink import counter_value
from tests.helpers.topics import isolated_topics

MAX_BYTES = 4096
REFUSE = (
    "refuse-me"  # in a model (sessions) or hostname (process listings): the contract takes it, a CHECK not
)
HOSTILE_TEXT = st.text(st.characters(codec=None), max_size=16)


@dataclass
class WorkloadDraft:
    """A session, a process listing, or raw bytes; each gets a unique request id / GPU when produced."""

    shape: str  # session | listing | raw
    raw: bytes | None = None
    key: str = "own"  # own | other
    label: str = "m"  # the session's model or the listing's hostname (a Label: any text but controls)
    refused: bool = False  # the label carries REFUSE: the database refuses the record
    to: str = "sessions"  # raw drafts: sessions | processes


drafts = st.one_of(
    st.builds(WorkloadDraft, shape=st.sampled_from(["session", "listing"])),
    st.builds(
        WorkloadDraft,
        shape=st.sampled_from(["session", "listing"]),
        label=HOSTILE_TEXT,
        refused=st.booleans(),
    ),
    st.builds(WorkloadDraft, shape=st.just("listing"), key=st.just("other")),
    st.builds(WorkloadDraft, shape=st.just("session"), label=st.just("x" * MAX_BYTES)),  # oversized
    st.builds(
        WorkloadDraft,
        shape=st.just("raw"),
        to=st.sampled_from(["sessions", "processes"]),
        raw=st.binary(max_size=200)
        | st.none()
        | st.recursive(
            st.none() | st.integers() | HOSTILE_TEXT, lambda inner: st.lists(inner, max_size=3)
        ).map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    ),
)
BATCHES = st.lists(drafts, min_size=1, max_size=12)


class WorkloadRun(HostileRun):
    """A hostile run over the workload topics; a stored row is named by its request id or GPU UUID."""

    def message(self, draft: WorkloadDraft, i: int) -> Produced:
        label = f"{draft.label}{REFUSE}" if draft.refused else draft.label
        at = (T0 + timedelta(seconds=i)).isoformat()
        if draft.shape == "session":
            ident = f"{i:032x}"
            record: dict[str, Any] = {
                "schema_version": 1, "kind": "session", "request_id": ident, "time": at, "source": "proxy",
                "monitor_id": "m", "server": "s", "endpoint": "/api/chat", "model": label, "streamed": False,
                "http_status": 200, "ok": True, "wall_ms": 1.5,
            }  # fmt: skip
            return Produced(
                self.topics.llm_sessions, b"s", _dumps(record), ident, _stores(record, _dumps(record))
            )
        ident = f"GPU-{i:08x}-0000-4000-8000-{uuid.uuid4().hex[:12]}"
        if draft.shape == "listing":
            record = {
                "schema_version": 1, "time": at, "source": "mock", "collector_id": "c", "hostname": label,
                "gpu_uuid": ident, "gpu_index": 0,
                "processes": [{"pid": 7, "type": "compute", "classification": "training", "rule": "r"}],
            }  # fmt: skip
            key = ident.encode() if draft.key == "own" else b"GPU-someone-else"
            accepted = _stores(record, _dumps(record)) and key == ident.encode()
            return Produced(self.topics.processes, key, _dumps(record), ident, accepted)
        topic = self.topics.llm_sessions if draft.to == "sessions" else self.topics.processes
        return Produced(topic, b"k", draft.raw, ident, False)  # no valid record is a list or random bytes


def _dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _stores(record: dict[str, Any], raw: bytes) -> bool:
    """The contract's verdict and the test's CHECKs: the record must be stored."""
    if len(raw) > MAX_BYTES:
        return False
    try:
        if "kind" in record:
            parsed = parse_llm_message(raw)
            return isinstance(parsed, LlmSession) and REFUSE not in parsed.model
        return REFUSE not in parse_gpu_processes(raw).hostname
    except ContractError:
        return False


def stored_ids(db: DatabaseSettings, ids: set[str]) -> list[str]:
    """The request ids and GPU UUIDs among `ids` stored, once per row."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT request_id FROM llm_sessions WHERE request_id = ANY(%s)"
            " UNION ALL SELECT gpu_uuid FROM gpu_process_polls WHERE gpu_uuid = ANY(%s)"
            " UNION ALL SELECT gpu_uuid FROM gpu_processes WHERE gpu_uuid = ANY(%s)",
            (list(ids), list(ids), list(ids)),
        ).fetchall()
    return [str(r[0]) for r in rows]


def stored_total(db: DatabaseSettings) -> int:
    """Sessions and process listings stored (the server snapshots are never produced here)."""
    with connect(db) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM llm_sessions) + (SELECT count(*) FROM gpu_process_polls)"
        ).fetchone()
    return int(str(row[0])) if row else 0


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory, processes=2, llm_sessions=2, dead_letters=2)


@pytest.fixture
def refusing(migrated: DatabaseSettings) -> DatabaseSettings:
    """The database refuses what the contract accepts: a CHECK on a table of each topic."""
    with connect(migrated) as conn:
        conn.execute(
            f"ALTER TABLE llm_sessions ADD CONSTRAINT refused_here CHECK (strpos(model, '{REFUSE}') = 0)"
        )
        conn.execute(
            "ALTER TABLE gpu_process_polls ADD CONSTRAINT refused_here"
            f" CHECK (strpos(hostname, '{REFUSE}') = 0)"
        )
        conn.commit()
    return migrated


def workload_loop(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str
) -> WorkloadLoop:
    return records_loop(WorkloadLoop, kafka, db, topics, group, max_message_bytes=MAX_BYTES)


Started = tuple[threading.Event, threading.Thread]


@pytest.fixture
def running() -> Iterator[Callable[[WorkloadLoop], Started]]:
    """Runs a loop on a thread (its run(stop) shape); stops, joins and closes it at the end."""
    started: list[tuple[WorkloadLoop, threading.Thread, threading.Event]] = []

    def start(loop: WorkloadLoop) -> Started:
        stop = threading.Event()
        thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
        thread.start()
        started.append((loop, thread, stop))
        return stop, thread

    yield start
    for loop, thread, stop in started:
        stop.set()
        thread.join(60)
        assert not thread.is_alive()
        with contextlib.suppress(RuntimeError):  # closed by the test already
            loop.consumer.close()


def lag_reported(loop: WorkloadLoop, topic: str) -> bool:
    return any(
        s.labels.get("topic") == topic for metric in loop.metrics.lag.collect() for s in metric.samples
    )


def test_hostile_workload_records_are_each_stored_or_dead_lettered_exactly_once(
    kafka_settings: KafkaSettings,
    refusing: DatabaseSettings,
    topics: TopicSettings,
    running: Callable[[WorkloadLoop], Started],
) -> None:
    group = f"workload-{uuid.uuid4().hex[:8]}"
    dlq = make_consumer(kafka_settings, group_id=f"read-{group}")
    dlq.subscribe([topics.dead_letters])
    run = WorkloadRun(topics, refusing, group, make_producer(kafka_settings), dlq)
    loop = workload_loop(kafka_settings, refusing, topics, group)

    @settings(
        max_examples=15, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(batch=BATCHES)
    # one record the database refuses among good ones of both topics: split out, the rest stored
    @example(
        batch=[
            WorkloadDraft("session"),
            WorkloadDraft("session", refused=True),
            WorkloadDraft("listing"),
            WorkloadDraft("session"),
        ]
    )
    @example(
        batch=[
            WorkloadDraft("listing"),
            WorkloadDraft("listing", label="é\u2028", refused=True),
            WorkloadDraft("session"),
        ]
    )
    @example(
        batch=[
            WorkloadDraft("raw", raw=b"{not json"),
            WorkloadDraft("raw", raw=None, to="processes"),
            WorkloadDraft("session"),
        ]
    )
    def one_example(batch: list[WorkloadDraft]) -> None:
        must_store, must_die = produce(run, list(batch))
        wait_until(lambda: stored_offsets_total(refusing, group) == run.n, 60, "every record's offset stored")
        assert not stop.is_set(), "the workload loop stopped"
        listings = {i for i in must_store if i.startswith("GPU-")}
        # each valid record once (a listing: its poll and its one process) ...
        assert sorted(stored_ids(refusing, must_store)) == sorted([*must_store, *listings])
        run.stored += len(must_store)
        assert stored_total(refusing) == run.stored  # ... and no other record
        await_dead_letters(run, must_die)

    stop, _ = running(loop)
    try:
        one_example()
    finally:
        dlq.close()
    undelivered, refused = dead_letter_ledger(refusing, group)
    assert undelivered == 0  # nothing left to send again after a restart
    assert refused >= 2  # the examples above: one refused by each table's CHECK
    assert counter_value(loop.metrics.dead_letters) == len(run.dead)
    wait_until(
        lambda: lag_reported(loop, topics.llm_sessions), 60, "gpuhealth_sink_lag of the workload topics"
    )


def test_stopped_while_retrying_then_restarted_a_bad_record_is_dead_lettered_once(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topics: TopicSettings,
    running: Callable[[WorkloadLoop], Started],
) -> None:
    """A dead letter is delivered after its batch is stored, never before: stopped while the batch
    is retried, nothing is delivered nor stored; the next run stores the good record once and
    dead-letters the bad one once (the old workload loop delivered it first, then again)."""
    group = f"workload-{uuid.uuid4().hex[:8]}"
    run = WorkloadRun(
        topics, migrated, group, make_producer(kafka_settings), make_consumer(kafka_settings, group_id=group)
    )
    with connect(migrated) as conn:  # not the records' fault: retried, never split
        conn.execute("ALTER TABLE llm_sessions RENAME TO llm_sessions_away")
        conn.commit()
    must_store, must_die = produce(run, [WorkloadDraft("raw", raw=b"{garbage"), WorkloadDraft("session")])
    first = workload_loop(kafka_settings, migrated, topics, group)
    first_stop, first_thread = running(first)
    wait_until(lambda: counter_value(first.metrics.db_retries) >= 3, 60, "retries of the batch")
    first_stop.set()
    first_thread.join(60)
    assert not first_thread.is_alive()
    first.consumer.close()  # it leaves the group at once
    assert stored_offsets_total(migrated, group) == 0
    assert dead_letters_in_topic(kafka_settings, topics.dead_letters) == 0
    with connect(migrated) as conn:
        conn.execute("ALTER TABLE llm_sessions_away RENAME TO llm_sessions")
        conn.commit()

    second = workload_loop(kafka_settings, migrated, topics, group)
    running(second)
    wait_until(lambda: stored_offsets_total(migrated, group) == run.n, 60, "every record's offset stored")
    wait_until(lambda: dead_letters_in_topic(kafka_settings, topics.dead_letters) >= 1, 60, "the dead letter")
    assert stored_ids(migrated, must_store) == sorted(must_store)
    assert dead_letters_in_topic(kafka_settings, topics.dead_letters) == len(must_die) == 1

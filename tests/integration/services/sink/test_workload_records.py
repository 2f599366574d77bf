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
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evaluation.pipeline import wait_until
from services.sink.workload import WorkloadLoop
from shared.contract.models_workload import LlmSession, parse_gpu_processes, parse_llm_message
from shared.fakes.samples import T0
from shared.plumbing.db import connect
from shared.plumbing.errors import ContractError
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.hostile import (
    HostileRun,
    Produced,
    example_lands,
    hostile_examples,
    hostile_run,
    ledger_balanced,
    loop_running,
    records_loop,
    refuse_in,
    stopped_while_retrying_then_restarted,
)
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


def stored_records(db: DatabaseSettings, ids: set[str]) -> list[str]:
    """The request ids and GPU UUIDs among `ids` stored, once a record: a listing once its poll and
    its one process are both there (a row stored twice shows twice)."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT request_id FROM llm_sessions WHERE request_id = ANY(%s)"
            " UNION ALL SELECT gpu_uuid FROM gpu_process_polls JOIN gpu_processes USING (gpu_uuid, time)"
            " WHERE gpu_uuid = ANY(%s)",
            (list(ids), list(ids)),
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


# What the contract accepts and the hostile run's database refuses, a CHECK on a table of each topic.
REFUSED = {
    "llm_sessions": f"strpos(model, '{REFUSE}') = 0",
    "gpu_process_polls": f"strpos(hostname, '{REFUSE}') = 0",
}
workload_loop = partial(records_loop, WorkloadLoop, max_message_bytes=MAX_BYTES)


def lag_reported(loop: WorkloadLoop, topic: str) -> bool:
    return any(
        s.labels.get("topic") == topic for metric in loop.metrics.lag.collect() for s in metric.samples
    )


def test_hostile_workload_records_are_each_stored_or_dead_lettered_exactly_once(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    refusing = refuse_in(migrated, REFUSED)
    run = hostile_run(WorkloadRun, kafka_settings, refusing, topics)
    loop = workload_loop(kafka_settings, refusing, topics, run.group)

    @hostile_examples(15)
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
        example_lands(
            run, batch, alive=lambda: not stop.is_set(), stored=lambda n: stored_records(refusing, n)
        )
        assert stored_total(refusing) == run.stored  # no record of another name either

    with contextlib.closing(run.dlq), loop_running(loop) as stop:
        one_example()
        wait_until(
            lambda: lag_reported(loop, topics.llm_sessions), 60, "gpuhealth_sink_lag of the workload topics"
        )
    ledger_balanced(run, loop)


def test_stopped_while_retrying_then_restarted_a_bad_record_is_dead_lettered_once(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """A dead letter is delivered after its batch is stored, never before (the old workload loop
    delivered it first, then again): tests/helpers/hostile.py says how."""
    drafts = [WorkloadDraft("raw", raw=b"{garbage"), WorkloadDraft("session")]
    stopped_while_retrying_then_restarted(
        WorkloadRun, drafts, kafka=kafka_settings, db=migrated, topics=topics, table="llm_sessions",
        loop=workload_loop, stored=stored_records,
    )  # fmt: skip

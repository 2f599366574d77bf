"""Hostile-record runs for the sink's property tests: produce drafts, know where each must end up,
read the dead letters back; and the hostile values the drafts are made of.

A test's `HostileRun` subclass turns one draft into a `Produced` message (topic, key, value, the
name its stored row will carry, and whether the contract and the test's CHECK let it be stored);
`produce` sends the drafts and returns what must be stored and what must be dead-lettered, by
the offsets the broker gave them; `drain` reads the dead-letter topic, checking each letter's group.
`example_lands` is one hypothesis example's whole check, `ledger_balanced` the check after the
last, and `stopped_while_retrying_then_restarted` the records loops' stop-and-restart test.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import confluent_kafka
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from evaluation.pipeline import stored_offsets_total, wait_until
from services.sink.metrics import SinkMetrics
from services.sink.records import RecordFamilyLoop
from shared.plumbing.db import connect
from shared.plumbing.kafka import make_consumer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.kafka import header_map
from tests.helpers.sink import counter_value

ANY_TEXT = st.text(st.characters(codec=None), max_size=12)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
NUMBERS = st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from([5e-324, 1e308, 2**63 - 1, -0.0])


def hostile_examples(max_examples: int) -> settings:
    """Hypothesis' settings for a hostile run: the explicit examples, then generated ones against the
    real broker and database (no deadline, no example database, every health check off)."""
    return settings(
        max_examples=max_examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip


def stored_suffixes(columns: dict[str, str]) -> Callable[[DatabaseSettings, set[str]], list[str]]:
    """A reader of what a run stored, for runs that name each record by the 12-character suffix its
    GPU UUID or hostname ends in: the suffixes asked for that each `table: column` holds, once a row."""
    union = " UNION ALL ".join(
        f"SELECT right({column}, 12) FROM {table} WHERE right({column}, 12) = ANY(%(suffixes)s)"
        for table, column in columns.items()
    )

    def stored(db: DatabaseSettings, suffixes: set[str]) -> list[str]:
        with connect(db) as conn:
            return [str(r[0]) for r in conn.execute(union, {"suffixes": list(suffixes)}).fetchall()]

    return stored


def deep(n: int) -> str:
    """JSON nested `n` lists deep: what makes a recursive parser give up."""
    return "[" * n + "]" * n


def any_value(max_bytes: int, *, deepest: int) -> st.SearchStrategy[bytes]:
    """A record's value from anyone: random bytes, any JSON (lone surrogates included), a GPU UUID
    nested up to `deepest` lists deep, or a value longer than the `max_bytes` the sink takes."""
    return (
        st.binary(max_size=300)
        | ANY_JSON.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        | st.integers(20, deepest).map(
            lambda n: ('{"schema_version": 1, "gpu_uuid": ' + deep(n) + "}").encode()
        )
        | st.integers(max_bytes, 3 * max_bytes).map(lambda n: b'{"hostname": "' + b"x" * n + b'"}')
    )


L = TypeVar("L", bound=RecordFamilyLoop)
R = TypeVar("R", bound="HostileRun")
Source = tuple[str, int, int]  # (topic, partition, offset) of a record


class Produced(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None
    name: str  # what identifies its stored row (the suffix of a GPU UUID or hostname)
    accepted: Callable[[], bool] | bool  # it must be stored (a callable: decided at delivery)
    refused_by_db: bool = False  # the contract takes it, the test's CHECK refuses it


@dataclass
class HostileRun(ABC):
    """What the examples share: one producer, one reader of the dead-letter topic, the tallies."""

    topics: TopicSettings
    db: DatabaseSettings
    group: str
    producer: confluent_kafka.Producer
    dlq: confluent_kafka.Consumer
    n: int = 0  # records produced so far (also makes each GPU, host and time unique)
    stored: int = 0
    dead: set[Source] = field(default_factory=set)
    refused_by_db: int = 0
    dead_seen: list[Source] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each produced record's name, in order

    @abstractmethod
    def message(self, draft: Any, i: int) -> Produced:
        """The i-th produced message, made from `draft`."""


def hostile_run(run_type: type[R], kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings) -> R:
    """A run in a consumer group of its own, reading the dead-letter topic from its start (close
    `run.dlq` when done)."""
    group = f"hostile-{uuid.uuid4().hex[:8]}"
    dlq = make_consumer(kafka, group_id=f"read-{group}")
    dlq.subscribe([topics.dead_letters])
    return run_type(topics, db, group, make_producer(kafka), dlq)


def refuse_in(db: DatabaseSettings, checks: dict[str, str]) -> DatabaseSettings:
    """The database refuses what the contract accepts: each table gets a CHECK (`refused_here`)."""
    with connect(db) as conn:
        for table, check in checks.items():
            conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT refused_here CHECK ({check})")
        conn.commit()
    return db


def produce(run: HostileRun, drafts: list[Any]) -> tuple[set[str], set[Source]]:
    """Produce the drafts: the names of what must be stored, the sources of what must be dead letters."""
    must_store: set[str] = set()
    must_die: set[Source] = set()

    def delivered(produced: Produced) -> Callable[..., None]:
        def done(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            assert err is None, err
            accepted = produced.accepted() if callable(produced.accepted) else produced.accepted
            if accepted:
                must_store.add(produced.name)
            else:
                must_die.add((msg.topic() or "", msg.partition() or 0, msg.offset() or 0))
                run.refused_by_db += produced.refused_by_db

        return done

    for draft in drafts:
        run.n += 1
        produced = run.message(draft, run.n)
        run.names.append(produced.name)
        run.producer.produce(
            produced.topic, key=produced.key, value=produced.value, on_delivery=delivered(produced)
        )
    assert run.producer.flush(30) == 0
    return must_store, must_die


def drain(run: HostileRun) -> int:
    """Read what the dead-letter topic has now; how many letters were seen so far."""
    for msg in run.dlq.consume(1000, 0.2):
        if msg.error() is None:
            h = header_map(msg)
            assert h["dlq.consumer_group"] == run.group
            run.dead_seen.append(
                (h["dlq.source.topic"], int(h["dlq.source.partition"]), int(h["dlq.source.offset"]))
            )
    return len(run.dead_seen)


def dead_letters_in_topic(kafka: KafkaSettings, topic: str) -> int:
    """Messages in the dead-letter topic (its partitions' end offsets: nothing is ever deleted there)."""
    consumer = make_consumer(kafka, group_id=f"count-{uuid.uuid4().hex[:8]}")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def await_dead_letters(run: HostileRun, must_die: set[Source]) -> None:
    """Wait for this example's dead letters; then every record that must die did so exactly once."""
    wait_until(lambda: drain(run) >= len(run.dead) + len(must_die), 60, "the dead letters")
    run.dead |= must_die
    assert len(run.dead_seen) == len(set(run.dead_seen)), "a record was dead-lettered twice"
    assert set(run.dead_seen) == run.dead  # each other record exactly once


def dead_letter_ledger(db: DatabaseSettings, group: str) -> tuple[int, int]:
    """(letters recorded but not delivered, letters the database refused) in sink_dead_letters."""
    with connect(db) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE delivered_at IS NULL),"
            " count(*) FILTER (WHERE category = 'database') FROM sink_dead_letters WHERE consumer_group = %s",
            (group,),
        ).fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


def records_loop(
    loop_type: type[L],
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    group: str,
    *,
    max_message_bytes: int,
) -> L:
    """A records loop (verifications, workload) as the hostile runs want it: quick retries, a size limit."""
    return loop_type(
        consumer=make_consumer(kafka, group_id=group), dlq_producer=make_producer(kafka), db=db,
        topics=topics, group=group, metrics=SinkMetrics(CollectorRegistry()),
        max_message_bytes=max_message_bytes, max_backoff_s=1,
        dlq_reader=lambda: make_consumer(kafka, group_id=f"{group}-dlq-check"),
    )  # fmt: skip


def example_lands(
    run: HostileRun, drafts: list[Any], *, alive: Callable[[], bool], stored: Callable[[set[str]], list[str]]
) -> None:
    """One example: its drafts produced, every offset stored, the loop still running (`alive`), each
    record that must be stored stored once and no other of the example's (`stored` gives the names
    it finds among those it is asked about, once per stored record), each other dead-lettered once."""
    must_store, must_die = produce(run, drafts)
    wait_until(lambda: stored_offsets_total(run.db, run.group) == run.n, 60, "every record's offset stored")
    assert alive(), "the loop stopped"
    found = stored(set(run.names[-len(drafts) :]))
    assert sorted(found) == sorted(must_store)  # each valid record once, no invalid one
    run.stored += len(found)
    await_dead_letters(run, must_die)


def ledger_balanced(run: HostileRun, loop: RecordFamilyLoop) -> None:
    """After a records loop's examples: no letter left to deliver after a restart, one refused by each
    of the two tables' CHECKs at least (the explicit examples), and /metrics counts every letter."""
    undelivered, refused = dead_letter_ledger(run.db, run.group)
    assert undelivered == 0
    assert refused >= 2
    assert counter_value(loop.metrics.dead_letters) == len(run.dead)
    assert run.stored + len(run.dead) == run.n


@contextlib.contextmanager
def loop_running(loop: RecordFamilyLoop) -> Iterator[threading.Event]:
    """`loop.run(stop)` on a thread for the block (the loop sets `stop` itself if it fails); then
    stopped, joined (its relay has delivered what it was going to) and its consumer closed."""
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(60)
        with contextlib.suppress(RuntimeError):  # closed by the test already
            loop.consumer.close()
    assert not thread.is_alive(), "the loop did not stop"


def rename_table(db: DatabaseSettings, table: str, to: str) -> None:
    with connect(db) as conn:
        conn.execute(f"ALTER TABLE {table} RENAME TO {to}")
        conn.commit()


def stopped_while_retrying_then_restarted(
    run_type: type[HostileRun],
    drafts: list[Any],
    *,
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    table: str,
    loop: Callable[[KafkaSettings, DatabaseSettings, TopicSettings, str], RecordFamilyLoop],
    stored: Callable[[DatabaseSettings, set[str]], list[str]],
) -> None:
    """SIGTERM (the stop) while a batch is retried, then a restart: a records loop's promise.

    `table` is renamed away, a failure that is not the records' fault (retried, never split). Stopped
    while it retries, the loop (`loop` builds one in the run's group) has stored nothing, delivered
    no dead letter and moved no offset. The next one stores each valid draft once (`stored` gives
    the names it finds, once a stored record) and dead-letters each bad one once, delivered after
    its batch was stored, never before."""
    run = hostile_run(run_type, kafka, db, topics)
    with contextlib.closing(run.dlq):
        rename_table(run.db, table, f"{table}_away")
        must_store, must_die = produce(run, drafts)
        first = loop(kafka, db, topics, run.group)
        with loop_running(first):  # stopped, it leaves the group at once (its consumer closed)
            wait_until(lambda: counter_value(first.metrics.db_retries) >= 3, 60, "retries of the batch")
        assert stored_offsets_total(run.db, run.group) == 0
        assert dead_letters_in_topic(kafka, run.topics.dead_letters) == 0
        rename_table(run.db, f"{table}_away", table)

        with loop_running(loop(kafka, db, topics, run.group)):
            wait_until(
                lambda: stored_offsets_total(run.db, run.group) == run.n, 60, "every record's offset stored"
            )
            assert sorted(stored(run.db, must_store)) == sorted(must_store)
        assert dead_letters_in_topic(kafka, run.topics.dead_letters) == len(must_die) > 0
        wait_until(lambda: drain(run) >= len(must_die), 60, "the dead letters")
        assert sorted(run.dead_seen) == sorted(must_die)

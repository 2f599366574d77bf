"""The sink stopped by SIGTERM whatever the database does: it exits 0 within the shutdown deadline.

Another session holds a lock on a table the sink writes (the offsets, the samples, the events, the
rollup's notes, the dead letters), and SIGTERM comes before the write reaches the lock, while it waits
on it, or while the batch is retried (a statement timeout of 1 s makes the wait fail and retry). Or the
server stops answering: a proxy between the sink and PostgreSQL holds every byte (no reply, no error,
no cancel request gets through). Each time the sink exits 0 within GPUHEALTH_SHUTDOWN__TIMEOUT_S, the
lock still held; the offsets stored never pass a row that is not; a restarted sink stores the rest once.

The longest SIGTERM-to-exit time of a run is printed against the deadline (`pytest -s`), and recorded in
docs/services/sink.md.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evaluation.pipeline import stored_offsets_total, wait_until
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.service_process import waiting_on_a_lock, watched_service
from tests.helpers.sink import (
    EVENT_EVERY,
    assert_no_offset_past_an_unstored_row,
    count,
    env_for,
    produce_mix,
    sink_topics,
    sink_until,
)
from tests.helpers.tcp_proxy import TcpProxy

DEADLINE_S = 10.0  # GPUHEALTH_SHUTDOWN__TIMEOUT_S here: cancel from 2.5 s, cut from 5 s
LOCKABLE = {
    "offsets": "kafka_offsets",
    "metrics": "gpu_metrics",
    "events": "gpu_events",
    "rollup state": "gpu_metrics_1min_pending",
    "dead letters": "sink_dead_letters",
}
WHEN = ("before the write reaches the lock", "while it waits", "while it retries")
TOOK: list[float] = []  # SIGTERM to exit, every example of this module


def sink_env(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str, *, lanes: int, batch: int
) -> dict[str, str]:
    return env_for(kafka, db, topics, group) | {
        "GPUHEALTH_SINK__LANES": str(lanes),
        "GPUHEALTH_SINK__BATCH_SIZE": str(batch),
        "GPUHEALTH_SHUTDOWN__TIMEOUT_S": str(DEADLINE_S),
    }


def holds_its_lock(locker: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = locker.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND mode = 'AccessExclusiveLock'"
        " AND granted AND relation IS NOT NULL"
    ).fetchone()
    return bool(row and int(str(row[0])) > 0)


def note(took: float) -> float:
    TOOK.append(took)
    print(f"SIGTERM to exit: {took:.2f} s; longest so far {max(TOOK):.2f} s of the {DEADLINE_S:g} s deadline")
    return took


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lanes=st.integers(min_value=1, max_value=4),
    batch=st.sampled_from([100, 500, 2000]),
    locked=st.sampled_from(sorted(LOCKABLE)),
    when=st.sampled_from(WHEN),
)
@example(lanes=1, batch=500, locked="offsets", when="while it waits")  # issue 47's shape
@example(lanes=2, batch=100, locked="metrics", when="while it retries")
@example(lanes=3, batch=2000, locked="events", when="before the write reaches the lock")
@example(lanes=4, batch=500, locked="rollup state", when="while it waits")
@example(lanes=1, batch=100, locked="dead letters", when="while it retries")
def test_sigterm_with_a_table_locked_exits_0_in_time_and_no_offset_passes_an_unstored_row(
    kafka_settings: KafkaSettings,
    db_settings: DatabaseSettings,
    topic_factory: Callable[..., str],
    lanes: int,
    batch: int,
    locked: str,
    when: str,
) -> None:
    with migrated_schema(db_settings, "test_stop") as db:
        topics = sink_topics(topic_factory)
        group = f"stop-{topics.metrics_raw}"
        env = sink_env(kafka_settings, db, topics, group, lanes=lanes, batch=batch)
        if when == "while it retries":  # the wait on the lock fails after 1 s, and the batch is retried
            env["GPUHEALTH_SINK__STATEMENT_TIMEOUT_MS"] = "1000"
        first = produce_mix(kafka_settings, topics, 0, 1_000)
        with watched_service("sink", env) as sink:
            wait_until(lambda: stored_offsets_total(db, group) == first, 120, "the first messages stored")
            with connect(db) as locker:
                locker.execute(f"LOCK TABLE {LOCKABLE[locked]} IN ACCESS EXCLUSIVE MODE")
                produce_mix(kafka_settings, topics, 1_000, 1_000 + 4 * batch)
                if when == "while it waits":
                    wait_until(lambda: waiting_on_a_lock(db), 60, "a statement to wait on the lock")
                elif when == "while it retries":
                    wait_until(lambda: sink.said("not stored, retrying"), 60, "a batch to be retried")
                note(sink.sigterm(DEADLINE_S))
                assert holds_its_lock(locker), "the lock was let go before the sink exited"
                locker.rollback()
        assert_no_offset_past_an_unstored_row(db, topics, group)


def test_sigterm_while_the_database_does_not_answer_exits_0_in_time_and_a_restart_stores_the_rest_once(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    """Between the sink and PostgreSQL, a proxy stops forwarding in the middle of the writes: a server
    (or network) gone quiet. No cancel request gets through either; the sink cuts its connections."""
    topics = sink_topics(topic_factory)
    group = f"quiet-{topics.metrics_raw}"
    samples = 6_000
    with TcpProxy(migrated.host, migrated.port) as proxy:
        quiet = migrated.model_copy(update={"port": proxy.port})
        env = sink_env(kafka_settings, quiet, topics, group, lanes=2, batch=500)
        first = produce_mix(kafka_settings, topics, 0, 2_000)
        with watched_service("sink", env) as sink:
            wait_until(lambda: stored_offsets_total(migrated, group) == first, 120, "the first stored")
            proxy.freeze()
            produce_mix(kafka_settings, topics, 2_000, samples)
            wait_until(lambda: proxy.held > 0, 60, "the sink to send what the server never gets")
            note(sink.sigterm(DEADLINE_S))
    # the proxy dropped the connections: the server rolled back what it had of them
    assert_no_offset_past_an_unstored_row(migrated, topics, group)
    direct = sink_env(kafka_settings, migrated, topics, group, lanes=2, batch=500)
    everything = samples + samples // EVENT_EVERY + 2
    sink_until(direct, lambda: stored_offsets_total(migrated, group) == everything, "the restarted sink")
    assert_no_offset_past_an_unstored_row(migrated, topics, group)
    assert count(migrated, "gpu_metrics") == samples
    assert count(migrated, "gpu_events") == samples // EVENT_EVERY
    assert count(migrated, "sink_dead_letters") == 2

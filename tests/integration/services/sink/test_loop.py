"""The sink on the real broker and the real database: exact counts, whatever happens."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from evaluation.pipeline import make_loop, stored_offsets_total, wait_until
from services.sink.loop import SinkLoop
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter, EarlierBatchError
from shared.fakes.samples import sample
from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.plumbing.kafka import make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from shared.store import rollup
from tests.helpers.kafka import consume_all, header_map
from tests.helpers.sink import (
    count,
    counter_value,
    env_for,
    produce_samples,
    running,
    sink_process,
    sink_topics,
    sink_until,
)
from tests.paths import REPO


class LateConsumer:
    """A consumer whose waits may last a little past the timeout the loop asked for."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return list(self._consumer.consume(num_messages, timeout + 0.01))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return sink_topics(topic_factory)


def test_n_samples_give_n_rows_and_a_replay_adds_none(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    n = 5000
    produce_samples(kafka_settings, topics.metrics_raw, 0, n)
    group = f"sink-{uuid.uuid4().hex[:8]}"
    with running(make_loop(kafka_settings, migrated, topics, group)) as loop:
        wait_until(lambda: stored_offsets_total(migrated, group) == n, 60, "all offsets stored")
    assert count(migrated, "gpu_metrics") == n
    assert count(migrated, "gpu_latest") == 50
    assert count(migrated, "gpu_assets") == 50
    # A new group has no stored offsets: it reads the whole topic again.
    replay = f"replay-{uuid.uuid4().hex[:8]}"
    with running(make_loop(kafka_settings, migrated, topics, replay)) as again:
        wait_until(lambda: stored_offsets_total(migrated, replay) == n, 60, "replay offsets stored")
    assert count(migrated, "gpu_metrics") == n
    dupes = counter_value(again.metrics.duplicates, table="gpu_metrics")
    assert dupes == n
    assert counter_value(loop.metrics.rows, table="gpu_metrics") == n
    with_rollup = count(migrated, "gpu_metrics_1min")
    assert with_rollup == 50 * len({sample(i)["time"][:16] for i in range(n)})


def hostile_mix() -> list[tuple[bytes | None, bytes | None, str]]:
    good = sample(0)
    key = good["gpu_uuid"].encode()
    return [
        (key, b'{"schema_version": 1, "time": ', "contract"),
        (key, json.dumps({**good, "gpu_temp_c": "hot"}).encode(), "contract"),
        (
            key,
            json.dumps({**good, "power_usage_w": 123.25}).replace("123.25", "NaN").encode(),
            "contract",
        ),
        (key, json.dumps({**good, "ecc_dbe_volatile_total": 10**30}).encode(), "contract"),
        (key, json.dumps({k: v for k, v in good.items() if k != "time"}).encode(), "contract"),
        (key, json.dumps({**good, "schema_version": 99}).encode(), "contract"),
        (key, json.dumps({**good, "hostname": "x" * 6000}).encode(), "oversized"),
        (b"GPU-someone-else", json.dumps(good).encode(), "key"),
        (key, b"\xff\xfe\x00garbage", "contract"),
        (key, None, "empty"),
    ]


def test_a_hostile_mix_goes_to_the_dlq_and_every_valid_record_is_stored(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    bad = hostile_mix()
    producer = make_producer(kafka_settings)
    valid = 0
    for i in range(200):  # valid and hostile records interleaved on every partition
        s = sample(i)
        producer.produce(topics.metrics_raw, key=s["gpu_uuid"].encode(), value=json.dumps(s).encode())
        valid += 1
        if i % 20 == 0:
            key, value, _ = bad[(i // 20) % len(bad)]
            producer.produce(topics.metrics_raw, key=key, value=value)
    for key, value, _ in bad:
        producer.produce(topics.metrics_raw, key=key, value=value)
    assert producer.flush(30) == 0
    group = f"sink-{uuid.uuid4().hex[:8]}"
    expected_dead = 10 + len(bad)
    with running(make_loop(kafka_settings, migrated, topics, group, max_message_bytes=4096)) as loop:
        wait_until(
            lambda: stored_offsets_total(migrated, group) == valid + expected_dead,
            60,
            "all offsets",
        )
    assert count(migrated, "gpu_metrics") == valid
    dead = consume_all(kafka_settings, topics.dead_letters, expected=expected_dead)
    assert len(dead) == expected_dead
    for msg in dead:
        headers = header_map(msg)
        assert headers["dlq.source.topic"] == topics.metrics_raw
        assert int(headers["dlq.source.offset"]) >= 0
        assert headers["dlq.error"]
    categories: dict[str, int] = {}
    for msg in dead:
        c = header_map(msg)["dlq.category"]
        categories[c] = categories.get(c, 0) + 1
    assert categories == {"contract": 14, "oversized": 1 + 1, "key": 1 + 1, "empty": 1 + 1}
    assert counter_value(loop.metrics.dead_letters) == expected_dead


def test_kill_9_mid_stream_then_restart_gives_exactly_n(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    n = 20_000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    env = env_for(kafka_settings, migrated, topics, group)
    produce_samples(kafka_settings, topics.metrics_raw, 0, n)
    first = sink_process(env)
    try:
        wait_until(lambda: count(migrated, "gpu_metrics") >= 2000, 60, "the sink to be mid-stream")
        first.kill()  # SIGKILL: no flush, no goodbye
        first.wait(10)
    finally:
        first.kill()
    at_kill = count(migrated, "gpu_metrics")
    assert at_kill < n, "the sink finished before it could be killed; raise n"
    sink_until(env, lambda: stored_offsets_total(migrated, group) == n, "the restarted sink to finish")
    assert count(migrated, "gpu_metrics") == n


@pytest.mark.local_stack
def test_a_database_restart_during_ingestion_loses_nothing(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    n = 6000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    services = [str(REPO / "scripts" / "services.sh")]
    with running(make_loop(kafka_settings, migrated, topics, group, batch_size=300)) as loop:
        produce_samples(kafka_settings, topics.metrics_raw, 0, n // 2)
        wait_until(lambda: count(migrated, "gpu_metrics") > 0, 60, "ingestion to start")
        subprocess.run([*services, "stop", "postgres"], check=True, capture_output=True)
        try:
            produce_samples(kafka_settings, topics.metrics_raw, n // 2, n)  # arrives while the DB is down
            wait_until(lambda: counter_value(loop.metrics.db_retries) >= 1, 60, "the sink to notice")
        finally:
            subprocess.run([*services, "start", "postgres"], check=True, capture_output=True)
        wait_until(lambda: stored_offsets_total(migrated, group) == n, 120, "ingestion to catch up")
    assert count(migrated, "gpu_metrics") == n


def test_two_sinks_in_one_group_split_partitions_and_count_exactly(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    n = 8000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    a = make_loop(kafka_settings, migrated, topics, group, batch_size=200)
    b = make_loop(kafka_settings, migrated, topics, group, batch_size=200)

    def raw(loop: SinkLoop) -> set[int]:
        return {p for t, p in loop.owned if t == topics.metrics_raw}

    with running(a), running(b):
        # The group settles first (the second sink's join moves partitions), then the data comes.
        wait_until(
            lambda: bool(raw(a)) and bool(raw(b)) and len(raw(a) | raw(b)) == 4, 60, "both sinks to join"
        )
        produce_samples(kafka_settings, topics.metrics_raw, 0, n)
        wait_until(lambda: stored_offsets_total(migrated, group) == n, 120, "both sinks to finish")
        raw_a, raw_b = raw(a), raw(b)
        # Each holds back its refresh for the other's partitions while that one is behind; once
        # both have caught up, nothing is held back: the rollup is whole while they still run.
        with connect(migrated, autocommit=True) as conn:
            wait_until(lambda: not rollup.behind(conn), 30, "the rollup to catch up with both")
    assert count(migrated, "gpu_metrics") == n
    assert count(migrated, "gpu_metrics_1min") == 50 * len({sample(i)["time"][:16] for i in range(n)})
    assert raw_a, (a.ever_owned, b.ever_owned)
    assert raw_b, (a.ever_owned, b.ever_owned)
    assert not raw_a & raw_b  # shared, not duplicated
    assert counter_value(a.metrics.batches) > 0
    assert counter_value(b.metrics.batches) > 0


def test_sigterm_stores_the_batch_in_flight_and_exits_zero(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    n = 3000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    produce_samples(kafka_settings, topics.metrics_raw, 0, n)
    proc = sink_process(env_for(kafka_settings, migrated, topics, group))
    try:
        wait_until(lambda: count(migrated, "gpu_metrics") > 0, 60, "the sink to start writing")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    # Whatever it had written, its stored offsets say exactly that much: nothing half-done.
    assert stored_offsets_total(migrated, group) == count(migrated, "gpu_metrics")


def test_a_batch_stored_as_the_topic_runs_dry_is_refreshed_without_waiting_out_the_poll(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """The consumer waits up to its poll timeout for a batch to fill; a write that finishes
    meanwhile is completed at once, so the rollup catches up with the last batch then, not
    a whole poll timeout later."""
    n, poll_timeout_s = 500, 6.0
    group = f"sink-{uuid.uuid4().hex[:8]}"
    produce_samples(kafka_settings, topics.metrics_raw, 0, n)
    loop = make_loop(kafka_settings, migrated, topics, group, batch_size=n, poll_timeout_s=poll_timeout_s)
    with running(loop), connect(migrated, autocommit=True) as conn:
        wait_until(lambda: stored_offsets_total(migrated, group) == n, 60, "all offsets stored")
        wait_until(lambda: not rollup.behind(conn), poll_timeout_s / 3, "the rollup refreshed")
    assert count(migrated, "gpu_metrics_1min") == 50 * len({sample(i)["time"][:16] for i in range(n)})


def test_a_sink_that_goes_idle_marks_its_partitions_caught_up_and_the_rollup_is_whole(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """However the last batch finished (here every wait that brings nothing ends past its
    deadline), an idle sink marks its partitions: they hold no refresh back."""
    n = 3000
    group = f"sink-{uuid.uuid4().hex[:8]}"
    produce_samples(kafka_settings, topics.metrics_raw, 0, n)
    loop = make_loop(kafka_settings, migrated, topics, group, batch_size=400, poll_timeout_s=0.05)
    loop.consumer = cast(Any, LateConsumer(loop.consumer))
    marked = (
        "SELECT count(*) FILTER (WHERE caught_up), count(*) FROM kafka_offsets"
        f" WHERE consumer_group = '{group}' AND topic = '{topics.metrics_raw}'"
    )
    with running(loop), connect(migrated, autocommit=True) as conn:
        wait_until(lambda: stored_offsets_total(migrated, group) == n, 60, "all offsets stored")
        wait_until(lambda: not rollup.behind(conn), 30, "the rollup refreshed while the sink runs")

        def all_marked() -> bool:
            done, partitions = conn.execute(marked).fetchone() or (0, 0)
            return bool(partitions) and done == partitions

        wait_until(all_marked, 30, "its partitions marked caught up")
    assert count(migrated, "gpu_metrics_1min") == 50 * len({sample(i)["time"][:16] for i in range(n)})


def test_a_batch_never_commits_after_an_earlier_one_failed(migrated: DatabaseSettings) -> None:
    """Two lanes write at once, but in order: batch 1 fails, so batch 2 (staged meanwhile) is not stored."""
    writer = BatchWriter(migrated, group="lanes", connections=2)
    rows = [stage_row(json.dumps(sample(i)).encode()) for i in range(200)]
    # A negative offset breaks kafka_offsets' CHECK: batch 1 fails inside PostgreSQL, after its rows went in.
    first = Batch(rows=rows[:100], next_offsets={("raw", 0): -1})
    second = Batch(rows=rows[100:], next_offsets={("raw", 0): 200})
    with ThreadPoolExecutor(max_workers=2) as pool:
        one = pool.submit(writer.write, first)
        two = pool.submit(writer.write, second, one.result)
        with pytest.raises(DatabaseError, match="next_offset"):
            one.result()
        with pytest.raises(EarlierBatchError, match="the batch before it"):
            two.result()
    try:
        assert count(migrated, "gpu_metrics") == 0
        assert stored_offsets_total(migrated, "lanes") == 0
        # Retried in order, both are stored, and the connections were fit to use again.
        writer.write(Batch(rows=rows[:100], next_offsets={("raw", 0): 100}))
        writer.write(second, lambda: None)
        assert count(migrated, "gpu_metrics") == 200
        assert stored_offsets_total(migrated, "lanes") == 200
    finally:
        writer.close()

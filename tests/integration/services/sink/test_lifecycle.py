"""The sink process stopped by SIGTERM mid-work: exit 0, each stored row with its offset, the rest re-read."""

from __future__ import annotations

import time
from collections.abc import Callable

from evaluation.pipeline import stored_offsets_total, wait_until
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.service_process import service_process, sigterm, waiting_on_a_lock
from tests.helpers.sink import (
    count,
    env_for,
    produce_samples,
    sink_topics,
    sink_until,
)

N = 20_000


def test_sigterm_mid_work_exits_0_and_what_was_in_hand_is_stored_or_re_read(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    topics = sink_topics(topic_factory)
    group = f"lifecycle-{topics.metrics_raw}"
    env = env_for(kafka_settings, migrated, topics, group)
    produce_samples(kafka_settings, topics.metrics_raw, 0, N)
    with service_process("sink", env) as proc:
        wait_until(lambda: stored_offsets_total(migrated, group) > 0, 120, "the first batch stored")
        sigterm(proc)  # batches of 500: more are in flight or in hand
    # What was in hand was either stored with its offset or left for the next run: never half of it.
    assert count(migrated, "gpu_metrics") == stored_offsets_total(migrated, group)
    sink_until(env, lambda: stored_offsets_total(migrated, group) == N, "the restarted sink to finish")
    assert count(migrated, "gpu_metrics") == N


def test_sigterm_while_a_write_waits_on_a_lock_cancels_it_and_exits_0_in_time(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    """Another session holds the offsets table: the sink's transaction hangs until SIGTERM cancels it.

    It exits 0 while the lock is still held (within its grace of 5 s plus the stop), its transaction rolled
    back: the rows of that batch are not stored, nor are their offsets. A restarted sink stores them once.
    """
    topics = sink_topics(topic_factory)
    group = f"locked-{topics.metrics_raw}"
    env = env_for(kafka_settings, migrated, topics, group)
    produce_samples(kafka_settings, topics.metrics_raw, 0, 1_000)
    with service_process("sink", env) as proc:
        wait_until(lambda: stored_offsets_total(migrated, group) == 1_000, 120, "the first samples stored")
        with connect(migrated) as locker:
            locker.execute("LOCK TABLE kafka_offsets IN ACCESS EXCLUSIVE MODE")
            produce_samples(kafka_settings, topics.metrics_raw, 1_000, 2_000)
            wait_until(lambda: waiting_on_a_lock(migrated), 60, "the sink's write to wait on the lock")
            started = time.monotonic()
            sigterm(proc, timeout_s=30)
            took = time.monotonic() - started
            assert waiting_on_a_lock(migrated) is False, "the cancelled statement still waits"
            locker.rollback()
        assert took < 20, f"the sink took {took:.1f} s to stop"
    # Nothing of the cancelled batch: every stored row has its stored offset, and the other way round.
    assert count(migrated, "gpu_metrics") == stored_offsets_total(migrated, group) == 1_000
    sink_until(env, lambda: stored_offsets_total(migrated, group) == 2_000, "the restarted sink to finish")
    assert count(migrated, "gpu_metrics") == 2_000

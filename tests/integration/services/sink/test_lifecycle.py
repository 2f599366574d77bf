"""The sink process stopped by SIGTERM mid-work: exit 0, each stored row with its offset, the rest re-read."""

from __future__ import annotations

from collections.abc import Callable

from evaluation.pipeline import stored_offsets_total, wait_until
from shared.config import DatabaseSettings, KafkaSettings
from tests.helpers.service_process import service_process, sigterm
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

"""The scorer stopped by SIGTERM mid-work: what its cycles queued goes out in the final flush.

The producer lingers for 5 minutes, so nothing leaves it before the flush in
the loop's `finally`: every verdict and alert on the topics arrived through it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from evaluation.pipeline import pipeline, wait_until
from services.scorer.build import build_scorer
from services.scorer.settings import ScorerSection, ScorerSettings
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import ServiceRun
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.service_process import service_process, sigterm, waiting_on_a_lock
from tests.helpers.topics import isolated_topics, topics_env


def test_sigterm_after_a_cycle_ends_the_loop_with_its_last_flush(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    topics = isolated_topics(topic_factory)
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=1) as p:
        p.inject(node=0, gpu=0, kind="dbe", after_s=300)
        p.run(1200)
        p.settle()
    settings = ScorerSettings(
        kafka=kafka_settings, db=migrated, topics=topics,
        scorer=ScorerSection(as_of="latest", interval_s=1, events=False),
    )  # fmt: skip
    producer = JsonProducer(make_producer(kafka_settings, {"linger.ms": 300_000}))
    registry = CollectorRegistry()
    scorer = build_scorer(settings, registry=registry, producer=producer)
    at_signal: list[int] = []

    def sigterm_after_a_cycle() -> None:
        try:
            wait_until(
                lambda: (registry.get_sample_value("gpuhealth_scorer_cycles_total") or 0) >= 1, 60, "a cycle"
            )
            at_signal.append(producer.delivered)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    with ServiceRun("scorer") as life:
        threading.Thread(target=sigterm_after_a_cycle, daemon=True).start()
        scorer.cycle.run(life.stop)
    assert at_signal == [0]  # queued, not sent, when the signal came
    assert len(producer) == 0  # the flush in the loop's finally sent it all
    verdicts = consume_all(kafka_settings, topics.health, expected=2)
    assert producer.delivered >= len(verdicts) >= 2
    assert len(consume_all(kafka_settings, topics.alerts, expected=2)) >= 2


def test_sigterm_while_a_cycle_waits_on_a_lock_cancels_it_and_the_process_exits_0_in_time(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    """Another session holds gpu_latest: the cycle's read hangs until SIGTERM's grace runs out and it is
    cancelled; the process exits 0 while the lock is still held, having written nothing of that cycle."""
    topics = isolated_topics(topic_factory)
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__HOST": migrated.host, "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": str(migrated.search_path), **topics_env(topics),
        "GPUHEALTH_SCORER__METRICS_PORT": "0", "GPUHEALTH_SCORER__INTERVAL_S": "1",
        "GPUHEALTH_SCORER__GROUP": f"scorer-{topics.events}",  # its own group: never the running stack's
    }  # fmt: skip
    with connect(migrated) as locker:
        locker.execute("LOCK TABLE gpu_latest IN ACCESS EXCLUSIVE MODE")
        with service_process("scorer", env) as proc:
            wait_until(lambda: waiting_on_a_lock(migrated), 60, "the scorer's cycle to wait on the lock")
            started = time.monotonic()
            sigterm(proc, timeout_s=30)
            took = time.monotonic() - started
            assert not waiting_on_a_lock(migrated), "the cancelled statement still waits"
        locker.rollback()
    assert took < 20, f"the scorer took {took:.1f} s to stop"
    with connect(migrated) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_status").fetchone() == (0,)

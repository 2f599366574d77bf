"""The command-line faces: Kafka's own console consumer, the set-up commands, `make services`."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest

from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import KafkaSettings
from tests.paths import REPO


def run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_console_consumer_wrapper_prints_what_the_test_produced(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=1)
    marker = uuid.uuid4().hex
    producer = JsonProducer(make_producer(kafka_settings))
    producer.produce(topic, "GPU-0", {"marker": marker})
    assert producer.flush(30) == 0
    out = run(
        [
            "bin/kafka-console-consumer",
            "--bootstrap-server",
            kafka_settings.bootstrap_servers,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "1",
            "--timeout-ms",
            "30000",
            "--formatter-property",
            "print.key=true",
        ]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f'GPU-0\t{{"marker":"{marker}"}}'


def test_topics_and_groups_wrappers_list_the_broker(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=2)
    out = run(["bin/kafka-topics", "--bootstrap-server", kafka_settings.bootstrap_servers, "--list"])
    assert out.returncode == 0, out.stderr
    assert topic in out.stdout.split()
    groups = run(
        [
            "bin/kafka-consumer-groups",
            "--bootstrap-server",
            kafka_settings.bootstrap_servers,
            "--list",
        ]
    )
    assert groups.returncode == 0, groups.stderr


def test_setup_commands_exit_zero_and_are_idempotent(kafka_settings: KafkaSettings, db_schema: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        **{
            f"GPUHEALTH_TOPICS__{k}": f"{k.lower()}-{suffix}"
            for k in ("METRICS_RAW", "EVENTS", "HEALTH", "ALERTS", "DEAD_LETTERS")
        },
    }
    for _ in range(2):
        topics = run([sys.executable, "-m", "shared.plumbing.topic_admin"], env)
        assert topics.returncode == 0, topics.stderr
        migrate = run([sys.executable, "-m", "shared.plumbing.migrate", "--schema", db_schema], env)
        assert migrate.returncode == 0, migrate.stderr
    assert '"applied": []' in migrate.stderr
    listing = run(["bin/kafka-topics", "--list"]).stdout.split()
    assert f"metrics_raw-{suffix}" in listing
    run(["bin/kafka-topics", "--delete", "--topic", f".*-{suffix}"])


def test_bad_settings_give_a_clear_error_not_a_traceback() -> None:
    out = run([sys.executable, "-m", "shared.plumbing.migrate"], {"GPUHEALTH_DB__PORT": "not-a-port"})
    assert out.returncode == 1
    assert "GPUHEALTH_DB__PORT" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.local_stack
def test_make_services_twice_leaves_one_broker_and_one_database() -> None:
    def pids() -> tuple[set[str], set[str]]:
        kafka = run(["pgrep", "-f", "kafka.Kafka"]).stdout.split()
        postgres = run(["pgrep", "-f", "-x", r".*/postgres -D .*"]).stdout.split()
        return set(kafka), set(postgres)

    before = pids()
    assert len(before[0]) == 1, before
    assert len(before[1]) == 1, before
    out = run(["make", "-s", "services"])
    assert out.returncode == 0, out.stderr
    assert "already running" in out.stderr
    assert pids() == before
    assert run(["scripts/services.sh", "status"]).returncode == 0

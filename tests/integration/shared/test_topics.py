"""Topic set-up against the real broker: creates, grows, configures, and is idempotent."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import ConfigResource

from shared.config import KafkaSettings, TopicSettings
from shared.kafka import make_admin
from shared.topics import TopicSpec, ensure_topics, project_topics


def describe(settings: KafkaSettings, name: str) -> tuple[int, str]:
    admin = make_admin(settings)
    partitions = len(admin.list_topics(name, timeout=10).topics[name].partitions)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    config = admin.describe_configs([resource])[resource].result()
    return partitions, config["retention.ms"].value


def test_project_topics_are_created_once_then_left_alone(kafka_settings: KafkaSettings) -> None:
    suffix = uuid.uuid4().hex[:8]
    topics = TopicSettings(
        metrics_raw=f"raw-{suffix}",
        events=f"events-{suffix}",
        health=f"health-{suffix}",
        alerts=f"alerts-{suffix}",
        dead_letters=f"dlq-{suffix}",
        processes=f"processes-{suffix}",
        llm_sessions=f"llm-{suffix}",
        verifications=f"verifications-{suffix}",
        systems=f"systems-{suffix}",
        partitions=4,
        retention_ms=3_600_000,
    )
    specs = project_topics(topics)
    admin = make_admin(kafka_settings)
    try:
        first = ensure_topics(admin, specs)
        assert first == {s.name: "created" for s in specs}
        second = ensure_topics(admin, specs)
        assert second == {s.name: "exists" for s in specs}
        assert describe(kafka_settings, f"raw-{suffix}") == (4, "3600000")
        assert describe(kafka_settings, f"events-{suffix}") == (4, str(topics.audit_retention_ms))
        assert describe(kafka_settings, f"verifications-{suffix}") == (4, "-1")  # an audit log: kept
    finally:
        for future in admin.delete_topics([s.name for s in specs]).values():
            future.result()


def test_existing_topic_is_grown_and_reconfigured(kafka_settings: KafkaSettings) -> None:
    name = f"grow-{uuid.uuid4().hex[:8]}"
    admin = make_admin(kafka_settings)
    try:
        ensure_topics(admin, [TopicSpec(name, 2, 1, {"retention.ms": "600000"})])
        done = ensure_topics(admin, [TopicSpec(name, 5, 1, {"retention.ms": "900000"})])
        assert done == {name: "partitions increased"}
        assert describe(kafka_settings, name) == (5, "900000")
        # Kafka cannot shrink a topic: asking for fewer leaves it as it is.
        assert ensure_topics(admin, [TopicSpec(name, 1, 1, {"retention.ms": "900000"})]) == {name: "exists"}
        assert describe(kafka_settings, name) == (5, "900000")
    finally:
        admin.delete_topics([name])[name].result()

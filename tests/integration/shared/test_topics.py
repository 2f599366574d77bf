"""Topic set-up against the real broker: creates, grows, configures, and is idempotent."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import ConfigResource

from shared.plumbing.kafka import make_admin
from shared.plumbing.topic_admin import TopicSpec, ensure_topics, project_topics
from shared.settings.common import KafkaSettings, TopicSettings


def describe(settings: KafkaSettings, name: str) -> tuple[int, str]:
    admin = make_admin(settings)
    partitions = len(admin.list_topics(name, timeout=10).topics[name].partitions)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    config = admin.describe_configs([resource])[resource].result()
    return partitions, config["retention.ms"].value


def test_project_topics_are_created_once_then_left_alone(kafka_settings: KafkaSettings) -> None:
    suffix = uuid.uuid4().hex[:8]
    # Every topic of the registry under a name of this test's own: one left at its default would be the
    # running pipeline's (`make up`), found to exist, and deleted at the end.
    names = {r.setting: f"{r.setting.replace('_', '-')}-{suffix}" for r in TopicSettings.registry()}
    topics = TopicSettings(**names, partitions=4, retention_ms=3_600_000)
    specs = project_topics(topics)
    admin = make_admin(kafka_settings)
    try:
        first = ensure_topics(admin, specs)
        assert first == {s.name: "created" for s in specs}
        second = ensure_topics(admin, specs)
        assert second == {s.name: "exists" for s in specs}
        assert describe(kafka_settings, topics.metrics_raw) == (4, "3600000")
        assert describe(kafka_settings, topics.events) == (4, str(topics.audit_retention_ms))
        assert describe(kafka_settings, topics.verifications) == (4, "-1")  # an audit log: kept
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

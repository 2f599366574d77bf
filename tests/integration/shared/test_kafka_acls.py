"""Kafka with identities, on the real broker: each principal may write and read only what the topic
registry grants it (shared/plumbing/topic_admin.py applies the ACLs), and a client without a certificate
gets nothing.

The broker `make services` runs takes TLS clients with a certificate of its CA only, and maps each
certificate's CN to its principal (scripts/services.sh). The ACLs are applied to this test's own topics.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from shared.contract.topic_registry import CONSUMER_GROUPS, PRINCIPALS
from shared.plumbing.kafka import make_admin, make_consumer, make_producer
from shared.plumbing.topic_admin import ensure_acls, project_acls
from shared.settings.common import KafkaSettings, TopicSettings
from tests.helpers.kafka import as_principal
from tests.helpers.topics import isolated_topics, topic_fields

DENIED = confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.fixture
def guarded(kafka_settings: KafkaSettings, topic_factory: Callable[..., str]) -> TopicSettings:
    """This test's own topics, with the registry's ACLs on them."""
    topics = isolated_topics(topic_factory, **dict.fromkeys(topic_fields(), 1))
    names = [getattr(topics, r.setting) for r in topics.registry()]
    ensure_acls(make_admin(kafka_settings), project_acls(topics), names)
    return topics


def write_outcomes(
    settings: KafkaSettings, topics: list[str], timeout_ms: int = 20_000, config: dict[str, Any] | None = None
) -> dict[str, int | None]:
    """One record to each topic as `settings`' principal: per topic, None (written) or the error code."""
    outcome: dict[str, int | None] = {}

    def delivered(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
        outcome[str(msg.topic())] = None if err is None else err.code()

    producer = make_producer(settings, {"message.timeout.ms": timeout_ms, **(config or {})})
    for topic in topics:
        producer.produce(topic, b'{"probe": true}', key=b"GPU-acl-probe", on_delivery=delivered)
    assert producer.flush(30) == 0
    return outcome


def test_each_principal_writes_exactly_the_topics_the_registry_lets_it(
    kafka_settings: KafkaSettings, guarded: TopicSettings
) -> None:
    names = {r.setting: getattr(guarded, r.setting) for r in guarded.registry()}
    for principal in (p for p in PRINCIPALS if p != "admin"):
        outcome = write_outcomes(as_principal(kafka_settings, principal), list(names.values()))
        for r in guarded.registry():
            expected = None if principal in r.topic.writers else DENIED
            assert outcome[names[r.setting]] == expected, (principal, r.setting, outcome[names[r.setting]])


def test_only_the_scorer_writes_verdicts_and_alerts(
    kafka_settings: KafkaSettings, guarded: TopicSettings
) -> None:
    verdicts = [guarded.health, guarded.alerts]
    assert set(write_outcomes(as_principal(kafka_settings, "scorer"), verdicts).values()) == {None}
    for forger in ("collector", "remediator", "sink", "llm-monitor", "api"):
        assert set(write_outcomes(as_principal(kafka_settings, forger), verdicts).values()) == {DENIED}, (
            forger
        )


def read_outcome(settings: KafkaSettings, topic: str, group: str) -> int | None:
    """Subscribe to `topic` in `group` and poll until a record or an error: None (read) or the error code."""
    consumer = make_consumer(settings, group_id=group)
    try:
        consumer.subscribe([topic])
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            return None if error is None else error.code()
        raise AssertionError(f"neither a record nor an error from {topic} in 60 s")
    finally:
        consumer.close()


def test_readers_read_and_others_are_refused(kafka_settings: KafkaSettings, guarded: TopicSettings) -> None:
    assert write_outcomes(kafka_settings, [guarded.health]) == {guarded.health: None}  # as the admin
    remediator = as_principal(kafka_settings, "remediator")
    own_group = f"{CONSUMER_GROUPS['remediator'][0]}-test-{uuid.uuid4().hex[:8]}"
    assert read_outcome(remediator, guarded.health, own_group) is None
    # not its group: the sink's group is the sink's
    sink_group = f"{CONSUMER_GROUPS['sink'][0]}-test-{uuid.uuid4().hex[:8]}"
    assert (
        read_outcome(remediator, guarded.health, sink_group)
        == confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED
    )
    # the collector may not read verdicts, even in a group of its own
    collector_group = f"{CONSUMER_GROUPS['collector'][0]}test-{uuid.uuid4().hex[:8]}"
    assert read_outcome(as_principal(kafka_settings, "collector"), guarded.health, collector_group) == DENIED


def test_a_client_without_a_certificate_is_refused(
    kafka_settings: KafkaSettings, guarded: TopicSettings
) -> None:
    errors: list[confluent_kafka.KafkaError] = []
    for anonymous in (
        as_principal(kafka_settings, None),  # TLS, no client certificate
        kafka_settings.model_copy(update={"security_protocol": "PLAINTEXT"}),  # not even TLS
    ):
        config = {"error_cb": errors.append}
        outcome = write_outcomes(anonymous, [guarded.health], timeout_ms=5_000, config=config)
        assert outcome == {guarded.health: confluent_kafka.KafkaError._MSG_TIMED_OUT}
        admin = make_admin(anonymous)
        with pytest.raises(confluent_kafka.KafkaException):
            admin.list_topics(timeout=3)
    assert any(
        e.code() in (confluent_kafka.KafkaError._TRANSPORT, confluent_kafka.KafkaError._SSL) for e in errors
    )


def test_acls_follow_the_registry_idempotently(kafka_settings: KafkaSettings, guarded: TopicSettings) -> None:
    admin = make_admin(kafka_settings)
    names = [getattr(guarded, r.setting) for r in guarded.registry()]
    assert ensure_acls(admin, project_acls(guarded), names) == {"created": 0, "deleted": 0}
    # a grant the registry does not make (the collector writing verdicts) is taken away again
    forged = project_acls(guarded) + [
        a for a in project_acls(guarded) if a.name == guarded.health and a.principal == "User:scorer"
    ]
    forged[-1] = confluent_kafka.admin.AclBinding(
        forged[-1].restype, forged[-1].name, forged[-1].resource_pattern_type, "User:collector", "*",
        forged[-1].operation, forged[-1].permission_type,
    )  # fmt: skip
    assert ensure_acls(admin, forged, names) == {"created": 1, "deleted": 0}
    assert write_outcomes(as_principal(kafka_settings, "collector"), [guarded.health]) == {
        guarded.health: None
    }
    assert ensure_acls(admin, project_acls(guarded), names) == {"created": 0, "deleted": 1}
    assert write_outcomes(as_principal(kafka_settings, "collector"), [guarded.health]) == {
        guarded.health: DENIED
    }

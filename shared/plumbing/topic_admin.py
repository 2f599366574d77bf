"""Creates the project's Kafka topics with their partitions and retention, and their ACLs, idempotently.

The topics are the registry's (shared/contract/topic_registry.py). A missing topic is
created; an existing one with fewer partitions than configured is grown (Kafka
cannot shrink); its retention is set to the configured value. Each topic's ACLs
are the registry's writers and readers (plus each service's consumer groups): a
missing ACL is created, and an ACL of a project principal on a project topic or
group that the registry no longer grants is deleted. Running it twice changes
nothing the second time. Command line: ``python -m shared.plumbing.topic_admin``.
"""

from __future__ import annotations

import logging
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from shared.contract.topic_registry import CONSUMER_GROUPS, PRINCIPALS, Keep, TopicSettings
from shared.plumbing.errors import GpuHealthError, KafkaTopicError
from shared.plumbing.kafka import make_admin, translate_error, wait_for_kafka
from shared.plumbing.logging import setup_logging
from shared.plumbing.service import refuse_arguments
from shared.settings.common import Settings, load_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)


def topic_config(keep: Keep, topics: TopicSettings, cleanup_policy: str = "delete") -> dict[str, str]:
    """A topic's configuration on the broker: how long it keeps records, and its cleanup policy."""
    if keep is Keep.FOREVER:  # never deleted by time or size
        return {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": cleanup_policy}
    retention_ms = topics.retention_ms if keep is Keep.RAW else topics.audit_retention_ms
    return {"retention.ms": str(retention_ms), "cleanup.policy": cleanup_policy}


def audit_log_spec(name: str, partitions: int, replication_factor: int) -> TopicSpec:
    """An audit log (gpu-verifications or a verifier's own): never deleted by time or size, not compacted."""
    return TopicSpec(
        name=name,
        partitions=partitions,
        replication_factor=replication_factor,
        config=topic_config(Keep.FOREVER, TopicSettings()),
    )


def project_topics(topics: TopicSettings) -> list[TopicSpec]:
    """Every topic of the registry (shared/contract/topic_registry.py), named and sized by configuration."""
    return [
        TopicSpec(
            name=getattr(topics, r.setting),
            partitions=r.topic.partitions or topics.partitions,
            replication_factor=topics.replication_factor,
            config=topic_config(r.topic.keep, topics, r.topic.cleanup_policy),
        )
        for r in topics.registry()
    ]


def _wait(futures: dict[str, Future[None]], what: str) -> dict[str, Exception | None]:
    outcome: dict[str, Exception | None] = {}
    for name, future in futures.items():
        try:
            future.result()
            outcome[name] = None
        except confluent_kafka.KafkaException as e:
            outcome[name] = e
        except Exception as e:
            raise KafkaTopicError(f"{what} {name}: {e}") from e
    return outcome


def _wait_for_metadata(admin: AdminClient, wanted: dict[str, int], timeout_s: float) -> dict[str, Any]:
    """Topic metadata once every topic shows in it with at least its wanted partitions.

    The brokers' metadata can lag a creation or a partition increase by a moment.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(
            n in topics and topics[n].error is None and len(topics[n].partitions) >= count
            for n, count in wanted.items()
        ):
            return dict(topics)
        if time.monotonic() > deadline:
            raise KafkaTopicError(f"topics {sorted(wanted)} do not show in the metadata as expected")
        time.sleep(0.2)


def ensure_topics(admin: AdminClient, specs: list[TopicSpec], timeout_s: float = 30.0) -> dict[str, str]:
    """Bring each topic to its spec; returns what was done per topic."""
    existing = admin.list_topics(timeout=timeout_s).topics
    done: dict[str, str] = {}

    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication_factor,
                    config=s.config,
                )
                for s in missing
            ],
            request_timeout=timeout_s,
        )
        already: list[str] = []
        for name, error in _wait(futures, "create topic").items():
            if error is None:
                done[name] = "created"
                continue
            kerr = error.args[0]
            if kerr.code() != confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                raise translate_error(kerr, f"create topic {name}") from error
            # It exists after all: metadata had not caught up with a recent creation, or
            # another runner made it meanwhile. Treat it as existing: grow and configure it.
            already.append(name)
        if already:
            existing = _wait_for_metadata(admin, dict.fromkeys(already, 1), timeout_s)

    present = [s for s in specs if s.name in existing and s.name not in done]
    grow = [s for s in present if len(existing[s.name].partitions) < s.partitions]
    if grow:
        futures = admin.create_partitions(
            [NewPartitions(s.name, s.partitions) for s in grow], request_timeout=timeout_s
        )
        for name, error in _wait(futures, "grow topic").items():
            if error is not None:
                raise translate_error(error.args[0], f"grow topic {name}") from error
            done[name] = "partitions increased"
        _wait_for_metadata(admin, {s.name: s.partitions for s in grow}, timeout_s)

    if present:
        resources = [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                s.name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in s.config.items()
                ],
            )
            for s in present
        ]
        configured = admin.incremental_alter_configs(resources, request_timeout=timeout_s)
        for resource, future in configured.items():
            try:
                future.result()
            except confluent_kafka.KafkaException as e:
                raise translate_error(e.args[0], f"configure topic {resource.name}") from e
            done.setdefault(resource.name, "exists")
        _wait_for_configs(admin, {s.name: s.config for s in present if s.config}, timeout_s)
    return done


def _wait_for_configs(admin: AdminClient, wanted: dict[str, dict[str, str]], timeout_s: float) -> None:
    """Return once the broker describes every topic with its wanted settings.

    In KRaft the controller commits a change before the broker's metadata shows it,
    so a describe right after an alter can still read the old value for a moment.
    """
    deadline = time.monotonic() + timeout_s
    pending = dict(wanted)
    while pending:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in pending]
        for resource, future in admin.describe_configs(resources, request_timeout=timeout_s).items():
            try:
                seen = future.result()
            except confluent_kafka.KafkaException as e:
                raise translate_error(e.args[0], f"describe topic {resource.name}") from e
            if all(k in seen and seen[k].value == v for k, v in pending[resource.name].items()):
                del pending[resource.name]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise KafkaTopicError(f"topics {sorted(pending)} do not show their new settings in time")
        time.sleep(0.2)


def _allow(
    kind: ResourceType, name: str, pattern: ResourcePatternType, who: str, op: AclOperation
) -> AclBinding:
    return AclBinding(kind, name, pattern, f"User:{who}", "*", op, AclPermissionType.ALLOW)


def project_acls(
    topics: TopicSettings, groups: dict[str, tuple[str, ...]] = CONSUMER_GROUPS
) -> list[AclBinding]:
    """What the registry grants: WRITE to each topic's writers, READ to its readers (each implies DESCRIBE),
    and READ on the consumer groups each principal's services join (by prefix)."""
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    acls = []
    for r in topics.registry():
        name = getattr(topics, r.setting)
        acls += [
            _allow(ResourceType.TOPIC, name, literal, who, AclOperation.WRITE) for who in r.topic.writers
        ]
        acls += [_allow(ResourceType.TOPIC, name, literal, who, AclOperation.READ) for who in r.topic.readers]
    for who, prefixes in groups.items():
        acls += [_allow(ResourceType.GROUP, prefix, prefixed, who, AclOperation.READ) for prefix in prefixes]
    return acls


def _key(acl: AclBinding) -> tuple[Any, ...]:
    return (
        acl.restype,
        acl.name,
        acl.resource_pattern_type,
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission_type,
    )


_ANY: Any = None  # an ACL filter's "any" (the stubs type these arguments as str)


def _existing_acls(admin: AdminClient, topic_names: list[str], timeout_s: float) -> list[AclBinding]:
    """The ACLs of the project's principals on `topic_names` and on any consumer group."""
    principals = {f"User:{p}" for p in PRINCIPALS}
    filters = [
        AclBindingFilter(
            ResourceType.TOPIC,
            name,
            ResourcePatternType.LITERAL,
            _ANY,
            _ANY,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        for name in topic_names
    ]
    filters.append(
        AclBindingFilter(
            ResourceType.GROUP,
            _ANY,
            ResourcePatternType.ANY,
            _ANY,
            _ANY,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    )
    found: list[AclBinding] = []
    for f in filters:
        try:
            found += admin.describe_acls(f, request_timeout=timeout_s).result()
        except confluent_kafka.KafkaException as e:
            raise translate_error(e.args[0], f"describe the ACLs of {f.name or 'the groups'}") from e
    return [a for a in found if a.principal in principals]


def ensure_acls(
    admin: AdminClient, wanted: list[AclBinding], topic_names: list[str], timeout_s: float = 30.0
) -> dict[str, int]:
    """Bring the ACLs of the project's principals on `topic_names` (and on groups) to `wanted`; counts of
    what was created and deleted. A broker without an authorizer is an error (KafkaTopicError)."""
    have = {_key(a): a for a in _existing_acls(admin, topic_names, timeout_s)}
    want = {_key(a): a for a in wanted}
    create = [a for k, a in want.items() if k not in have]
    stale = [a for k, a in have.items() if k not in want]
    if create:
        for acl, future in zip(
            create, admin.create_acls(create, request_timeout=timeout_s).values(), strict=True
        ):
            try:
                future.result()
            except confluent_kafka.KafkaException as e:
                raise translate_error(e.args[0], f"create ACL {acl}") from e
    if stale:
        filters = [
            AclBindingFilter(
                a.restype,
                a.name,
                a.resource_pattern_type,
                a.principal,
                a.host,
                a.operation,
                a.permission_type,
            )
            for a in stale
        ]
        for flt, future in admin.delete_acls(filters, request_timeout=timeout_s).items():
            try:
                future.result()
            except confluent_kafka.KafkaException as e:
                raise translate_error(e.args[0], f"delete ACL {flt}") from e
    if create or stale:  # the controller commits them before the broker's authorizer has them
        deadline = time.monotonic() + timeout_s
        while {_key(a) for a in _existing_acls(admin, topic_names, timeout_s)} != set(want):
            if time.monotonic() > deadline:
                raise KafkaTopicError("the broker does not show the ACLs as set in time")
            time.sleep(0.2)
    return {"created": len(create), "deleted": len(stale)}


def main() -> int:
    refuse_arguments(Settings, "topics", sys.argv[1:])
    try:
        settings = load_settings(Settings)
        setup_logging(settings.log.level, json_format=settings.log.json_format, service="topics")
        wait_for_kafka(settings.kafka, timeout_s=60)
        admin = make_admin(settings.kafka)
        specs = project_topics(settings.topics)
        done = ensure_topics(admin, specs)
        acls = (
            ensure_acls(admin, project_acls(settings.topics), [s.name for s in specs])
            if settings.topics.acls
            else {"skipped": 1}
        )
    except GpuHealthError as e:
        log.error("%s", e)
        return 1
    log.info("topics ready", extra={"topics": done, "acls": acls})
    return 0


if __name__ == "__main__":
    sys.exit(main())

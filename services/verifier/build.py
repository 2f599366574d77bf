"""The verifier's object graph: the chain its records are appended to, on the broker its settings name or in
memory (`--no-publish`), for its commands and `services.verifier.oplog`."""

from __future__ import annotations

from .chainlog import Chain, KafkaChain, MemoryChain
from .settings import VerifierSettings, load_verifier_settings


def topic_of(settings: VerifierSettings, topic: str | None = None) -> str:
    """The audit chain's topic: `topic` when given (`--topic`), else GPUHEALTH_TOPICS__VERIFICATIONS."""
    return topic or settings.topics.verifications


def kafka_chain(settings: VerifierSettings, topic: str | None = None) -> KafkaChain:
    """The chain on the broker (its topic made the audit log's if it is not yet), its heads read from it."""
    return KafkaChain(
        settings.kafka,
        topic_of(settings, topic),
        partitions=settings.topics.partitions,
        replication_factor=settings.topics.replication_factor,
        timeout_s=settings.verifier.kafka_timeout_s,
    )


def build_chain(*, publish: bool, topic: str | None = None) -> Chain:
    """Where `compute` appends: the broker's chain (settings from the environment: ConfigError when one
    is invalid), or, not publishing, a chain in memory that needs no settings at all."""
    if not publish:
        return MemoryChain()
    return kafka_chain(load_verifier_settings(), topic)

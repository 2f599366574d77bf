"""Appending records to the gpu-verifications chain, and reading the topic back for an audit.

`Chain` numbers each GPU's records and links each to the previous one
(shared.contract.chain defines the bytes and the hash). `KafkaChain` finds every GPU's
chain head by reading the topic once, then produces each record keyed by its
GPU's UUID and waits for the broker's acknowledgement, so a record the caller
was told about is on the broker. Two writers appending to one GPU's chain at
the same moment would fork it; the audit reports a fork as a broken link.
Kafka imports are deferred: the compute check runs on machines without the
Kafka client (`--no-publish`).
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.contract.chain import (
    GENESIS,
    AuditReport,
    BrokenLink,
    ChainEntry,
    ChainHead,
    canonical_bytes,
    link_of,
    verify_chain,
)
from shared.contract.models_verify import VerificationRecord, record_json
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.errors import ContractError, KafkaProduceError, KafkaTopicError, KafkaUnavailableError

if TYPE_CHECKING:
    from shared.settings.common import KafkaSettings

log = logging.getLogger(__name__)
VERIFICATIONS = TopicSettings.entry("verifications")


def _wire(record: VerificationRecord) -> tuple[bytes, bytes]:
    """A record's key and value as the topic has them: the value's canonical bytes, whose hash is chained."""
    key, value = VERIFICATIONS.encode(record)
    return key.encode(), canonical_bytes(value)


class Chain(ABC):
    """Numbers and links records per GPU; subclasses decide where a record goes."""

    def __init__(self, heads: dict[str, ChainHead] | None = None) -> None:
        self.heads: dict[str, ChainHead] = dict(heads or {})

    def append(self, fields: dict[str, Any]) -> VerificationRecord:
        """Validate, link and emit one record; `fields` has everything but time, seq and prev."""
        gpu = str(fields.get("gpu_uuid"))
        head = self.heads.get(gpu)
        record = VerificationRecord.model_validate(
            {
                **fields,
                "time": datetime.now(UTC),
                "seq": head.seq + 1 if head else 0,
                "prev_sha256": head.sha256 if head else GENESIS,
            }
        )
        where = self._emit(record)
        self.heads[gpu] = ChainHead(record.seq, link_of(record_json(record)), *where)
        return record

    @abstractmethod
    def _emit(self, record: VerificationRecord) -> tuple[int, int]:
        """Store the record; returns its (partition, offset)."""


class MemoryChain(Chain):
    """Keeps records in memory (tests, and `--no-publish` runs that only print)."""

    def __init__(self, heads: dict[str, ChainHead] | None = None) -> None:
        super().__init__(heads)
        self.records: list[VerificationRecord] = []

    def _emit(self, record: VerificationRecord) -> tuple[int, int]:
        self.records.append(record)
        return 0, len(self.records) - 1

    def entries(self) -> list[ChainEntry]:
        return [ChainEntry(0, i, *_wire(r)) for i, r in enumerate(self.records)]


def read_topic(
    settings: KafkaSettings, topic: str, timeout_s: float = 60.0
) -> tuple[list[ChainEntry], list[BrokenLink]]:
    """Every record of `topic` up to its end when the read began, and partitions missing their start.

    A partition whose first offset is not 0 has lost records (deleted by retention
    or by hand): that is reported as a broken link, since the chain cannot be
    checked across the gap.
    """
    import confluent_kafka

    from shared.plumbing.kafka import make_consumer

    consumer = make_consumer(
        settings,
        group_id=f"gpu-health-audit-{uuid.uuid4().hex[:12]}",
        overrides={"enable.partition.eof": True, "client.id": f"{settings.client_id}-audit"},
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaTopicError(f"topic {topic} cannot be read: {getattr(meta, 'error', 'missing')}")
        ends: dict[int, int] = {}
        gaps: list[BrokenLink] = []
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=timeout_s
            )
            if low > 0:
                gaps.append(BrokenLink(None, p, low, f"records before offset {low} were deleted"))
            if high > low:
                ends[p] = high
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in ends]
        )
        entries: list[ChainEntry] = []
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"{topic} not read to its end within {timeout_s:g} s", retriable=True
                )
            for msg in consumer.consume(1000, 0.5):
                p, err = msg.partition(), msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        pending.discard(p)
                        continue
                    raise KafkaUnavailableError(f"reading {topic}: {err.str()}", retriable=err.retriable())
                offset = msg.offset() or 0
                if p not in pending or offset >= ends[p]:
                    continue  # written after the read began
                entries.append(ChainEntry(p, offset, msg.key(), msg.value()))
                if offset + 1 >= ends[p]:
                    pending.discard(p)
        return entries, gaps
    except confluent_kafka.KafkaException as e:
        raise KafkaUnavailableError(f"reading {topic}: {e}", retriable=True) from e
    finally:
        consumer.close()


def audit_topic(settings: KafkaSettings, topic: str, timeout_s: float = 60.0) -> AuditReport:
    entries, gaps = read_topic(settings, topic, timeout_s)
    report = verify_chain(entries)
    report.broken = sorted([*gaps, *report.broken], key=lambda b: (b.partition, b.offset))
    return report


class KafkaChain(Chain):
    """Appends to the chain on the broker; the heads come from reading the topic first."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        partitions: int = 6,
        replication_factor: int = 1,
        timeout_s: float = 60.0,
    ) -> None:
        import confluent_kafka

        from shared.plumbing.kafka import make_admin, make_producer
        from shared.plumbing.topic_admin import audit_log_spec, ensure_topics

        try:
            ensure_topics(
                make_admin(settings), [audit_log_spec(topic, partitions, replication_factor)], timeout_s
            )
        except confluent_kafka.KafkaException as e:
            raise KafkaUnavailableError(f"cannot prepare {topic}: {e}", retriable=True) from e
        entries, _ = read_topic(settings, topic, timeout_s)
        super().__init__(verify_chain(entries).heads)
        self.topic, self.timeout_s = topic, timeout_s
        self._kafka = confluent_kafka
        self._producer = make_producer(settings, {"client.id": f"{settings.client_id}-verifier"})

    def _emit(self, record: VerificationRecord) -> tuple[int, int]:
        delivered: list[Any] = []

        def on_delivery(err: Any, msg: Any) -> None:
            delivered.append(err if err is not None else (msg.partition(), msg.offset()))

        key, value = _wire(record)
        if len(value) > 1_000_000:
            raise ContractError(f"record of {len(value)} bytes is too large for the topic")
        self._producer.produce(self.topic, value=value, key=key, on_delivery=on_delivery)
        self._producer.flush(self.timeout_s)
        if not delivered or not isinstance(delivered[0], tuple):
            why = delivered[0].str() if delivered else "no acknowledgement in time"
            raise KafkaProduceError(f"verification record not stored on {self.topic}: {why}", retriable=True)
        partition, offset = delivered[0]
        log.info("record appended", extra={"gpu_uuid": record.gpu_uuid, "seq": record.seq, "offset": offset})
        return int(partition), int(offset)

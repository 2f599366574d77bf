"""The audit chain on the real broker under what a topic can suffer: records deleted from its start
(truncation), records re-sent (a duplicate) or written back in another order, and two writers appending
to one GPU's chain at once (a fork). Each is found by `audit_topic` reading the topic back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pydantic import ValidationError

from services.verifier.chainlog import KafkaChain, MemoryChain, audit_topic
from shared.contract.models_verify import Outcome, RecordKind, record_bytes
from shared.plumbing.errors import KafkaTopicError
from shared.plumbing.kafka import make_admin, make_producer
from shared.settings.common import KafkaSettings
from tests.helpers.verifier_fakes import UUIDS


def check(gpu: str, name: str) -> dict[str, Any]:
    return {
        "kind": RecordKind.COMPUTE_CHECK,
        "gpu_uuid": gpu,
        "hostname": "node-1",
        "verifier_id": "node-1",
        "name": name,
        "device": "cuda:0",
        "outcome": Outcome.PASS,
    }


def produce(settings: KafkaSettings, topic: str, values: list[bytes], key: str = UUIDS[0]) -> None:
    producer = make_producer(settings)
    for value in values:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(30) == 0


@pytest.fixture
def one_partition(topic_factory: Callable[..., str]) -> str:
    """An audit topic of one partition, so offsets are the order the records were written in."""
    return topic_factory(partitions=1, prefix="verifications")


def test_records_deleted_from_the_start_are_reported_and_the_rest_still_checked(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    chain = KafkaChain(kafka_settings, one_partition, partitions=1)
    for i in range(5):
        chain.append(check(UUIDS[0], f"op-{i}"))
    assert audit_topic(kafka_settings, one_partition).intact
    admin = make_admin(kafka_settings)  # held: its futures complete only while it lives
    (deleted,) = admin.delete_records([TopicPartition(one_partition, 0, 2)], operation_timeout=30).values()
    assert deleted.result(60).low_watermark == 2
    report = audit_topic(kafka_settings, one_partition)
    assert report.records == 3
    assert [(b.offset, b.reason) for b in report.broken] == [
        (2, "records before offset 2 were deleted"),
        (2, "the chain starts at seq 2, not at its genesis record (seq 0)"),
    ]
    assert report.heads[UUIDS[0]].seq == 4  # the records left still link to one another


def test_a_record_sent_twice_is_a_broken_link_at_the_copy(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    chain = MemoryChain()
    for i in range(3):
        chain.append(check(UUIDS[0], f"op-{i}"))
    values = [record_bytes(r) for r in chain.records]
    produce(kafka_settings, one_partition, [values[0], values[1], values[1], values[2]])
    report = audit_topic(kafka_settings, one_partition)
    assert [b.offset for b in report.broken] == [2]
    assert "does not match the previous record's hash" in report.broken[0].reason


def test_records_written_back_in_another_order_break_the_chain(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    chain = MemoryChain()
    for i in range(4):
        chain.append(check(UUIDS[0], f"op-{i}"))
    values = [record_bytes(r) for r in chain.records]
    produce(kafka_settings, one_partition, [values[0], values[2], values[1], values[3]])
    report = audit_topic(kafka_settings, one_partition)
    assert [b.offset for b in report.broken] == [1, 2, 3]
    assert not report.intact


def test_two_writers_from_one_head_fork_the_chain_and_the_audit_says_where(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    first = KafkaChain(kafka_settings, one_partition, partitions=1)
    first.append(check(UUIDS[0], "op-0"))
    mine = KafkaChain(kafka_settings, one_partition, partitions=1)  # both read the chain's head: seq 0
    theirs = KafkaChain(kafka_settings, one_partition, partitions=1)
    a = mine.append(check(UUIDS[0], "mine"))
    b = theirs.append(check(UUIDS[0], "theirs"))
    assert (a.seq, b.seq) == (1, 1)
    assert a.prev_sha256 == b.prev_sha256
    report = audit_topic(kafka_settings, one_partition)
    assert [b.offset for b in report.broken] == [2]
    # the next writer follows the newest record, so the chain goes on from the fork
    after = KafkaChain(kafka_settings, one_partition, partitions=1).append(check(UUIDS[0], "after"))
    assert after.seq == 2
    assert [b.offset for b in audit_topic(kafka_settings, one_partition).broken] == [2]


def test_hostile_messages_on_the_topic_are_broken_links_not_a_failed_audit(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    chain = KafkaChain(kafka_settings, one_partition, partitions=1)
    chain.append(check(UUIDS[0], "op-0"))
    good = json.loads(record_bytes(MemoryChain().append(check(UUIDS[1], "x"))))
    hostile = [
        b"",
        b"\xff\xfe",
        b"[" * 50_000,
        b'{"gpu_uuid": "' + UUIDS[0].encode() + b'", "seq": 1e400}',
        json.dumps({**good, "seq": -1}).encode(),
    ]
    produce(kafka_settings, one_partition, hostile)
    report = audit_topic(kafka_settings, one_partition)
    assert report.records == 6
    assert [b.offset for b in report.broken] == [1, 2, 3, 4, 5]
    assert report.heads[UUIDS[0]].seq == 0


def test_a_record_that_breaks_its_contract_is_refused_before_it_is_sent_and_links_nothing(
    kafka_settings: KafkaSettings, one_partition: str
) -> None:
    chain = KafkaChain(kafka_settings, one_partition, partitions=1)
    with pytest.raises(ValidationError, match="reason"):
        chain.append({**check(UUIDS[0], "long"), "reason": "x" * 100_000})
    assert UUIDS[0] not in chain.heads  # the next record is still the genesis
    assert chain.append(check(UUIDS[0], "op-0")).seq == 0
    report = audit_topic(kafka_settings, one_partition)
    assert (report.records, report.intact) == (1, True)


def test_auditing_a_topic_that_does_not_exist_says_so(kafka_settings: KafkaSettings) -> None:
    with pytest.raises(KafkaTopicError, match="cannot be read"):
        audit_topic(kafka_settings, f"verifications-missing-{uuid.uuid4().hex[:12]}", timeout_s=10)

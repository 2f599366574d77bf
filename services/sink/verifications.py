"""gpu-verifications and gpu-systems records: how a message becomes a row, and the loop that stores them.

The records are few (a check, an operation, a node's identity) and must never
be lost; they are stored by the sink's records loop (records.py: one consumer,
group ``<group>-records``, one transaction per batch with its dead letters and
offsets, refused records split out, each dead letter delivered exactly once).
This module says what is a record here: one that breaks its contract
(shared.contract.models_verify), whose key is not its GPU's UUID (verifications) or its
hostname (systems), or that is oversized, is a dead letter; the others are rows
for shared.store.verifications.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from shared.contract.chain import link_of, parse_canonical_input
from shared.contract.models_verify import SystemIdentity, VerificationRecord, record_json
from shared.contract.topic_registry import KeyMismatchError
from shared.settings.common import TopicSettings
from shared.store import verifications

from .deadletters import DeadLetter, Origin, unreadable
from .decode import Record
from .records import Cursor, Item, RecordFamilyLoop

VERIFICATIONS_TOPIC, SYSTEMS_TOPIC = TopicSettings.entry("verifications"), TopicSettings.entry("systems")

VERIFICATIONS, SYSTEMS = "gpu_verifications", "gpu_systems"  # the tables, as the rows metric names them


@dataclass(slots=True)
class VerificationBatch:
    verifications: list[tuple[Any, ...]] = field(default_factory=list)
    systems: list[tuple[Any, ...]] = field(default_factory=list)
    # parallel to verifications and systems: where each came from, to dead-letter it if refused
    verification_origins: list[Origin] = field(default_factory=list)
    system_origins: list[Origin] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def items(self) -> list[Item]:
        return [
            *(
                (VERIFICATIONS, r, o)
                for r, o in zip(self.verifications, self.verification_origins, strict=True)
            ),
            *((SYSTEMS, r, o) for r, o in zip(self.systems, self.system_origins, strict=True)),
        ]


def decode_records(messages: Sequence[Record], topics: TopicSettings, max_bytes: int) -> VerificationBatch:
    """Rows for the two tables, and dead letters for whatever cannot be stored."""
    batch = VerificationBatch()
    for msg in messages:
        if msg.error() is not None:
            continue
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        batch.next_offsets[(topic, partition)] = max(
            batch.next_offsets.get((topic, partition), 0), offset + 1
        )
        value, key = msg.value(), msg.key()
        refused = unreadable(value, max_bytes)
        if refused is None:
            assert value is not None  # unreadable() refuses a record without one
            try:
                if topic == topics.verifications:
                    r = VERIFICATIONS_TOPIC.read(VerificationRecord, value)
                    VERIFICATIONS_TOPIC.check_key(
                        key, r
                    )  # the chain is per GPU: its partition keeps it in order
                    batch.verifications.append(
                        (
                            r.time,
                            r.gpu_uuid,
                            r.seq,
                            r.kind.value,
                            r.name,
                            r.outcome.value,
                            r.hostname,
                            r.device,
                            r.backend,
                            r.device_ms,
                            r.cpu_ms,
                            r.speedup,
                            r.prev_sha256,
                            link_of(parse_canonical_input(value)),
                            Jsonb(record_json(r)),
                            partition,
                            offset,
                        )
                    )
                    batch.verification_origins.append((topic, partition, offset, key, value))
                elif topic == topics.systems:
                    s = SYSTEMS_TOPIC.read(SystemIdentity, value)
                    SYSTEMS_TOPIC.check_key(key, s)
                    batch.systems.append(
                        (
                            s.time,
                            s.hostname,
                            s.identity_sha256,
                            s.source,
                            len(s.gpus),
                            Jsonb(record_json(s)),
                        )
                    )
                    batch.system_origins.append((topic, partition, offset, key, value))
                else:
                    refused = ("topic", f"this loop does not read topic {topic!r}")
            except KeyMismatchError as e:
                refused = ("key", str(e))
            except Exception as e:  # whatever a record is, it is not a crash
                refused = ("contract", str(e)[:4000])
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return batch


class VerificationRecords:
    """The records loop's family for gpu-verifications and gpu-systems."""

    name = "verification/system records"

    def topics(self, topics: TopicSettings) -> list[str]:
        return topics.stored_by("verification")

    def batch_of(
        self, messages: Sequence[Record], topics: TopicSettings, max_bytes: int
    ) -> VerificationBatch:
        return decode_records(messages, topics, max_bytes)

    def insert(self, cur: Cursor, table: str, record: Any) -> int:
        if table == VERIFICATIONS:
            return verifications.insert_verification(cur, record)
        return verifications.insert_system(cur, record)


class VerificationLoop(RecordFamilyLoop):
    """The loop of the verification family: gpu-verifications and gpu-systems (constructor: its base's)."""

    family_type = VerificationRecords

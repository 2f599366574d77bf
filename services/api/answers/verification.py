"""The verifier's answers: a GPU's verification records, the nodes' identities."""

from __future__ import annotations

from pydantic import Field

from . import Answer, ApiTime, NextCursor, StoredObject, Total


class VerificationRecord(Answer):
    time: ApiTime
    seq: int
    kind: str
    name: str
    outcome: str
    hostname: str
    device: str | None
    backend: str | None
    device_ms: float | None
    cpu_ms: float | None
    speedup: float | None
    prev_sha256: str
    sha256: str
    record: StoredObject
    source_partition: int
    source_offset: int


class ChainBreak(Answer):
    seq: int
    reason: str


class Verifications(Answer):
    gpu_uuid: str
    verifications: list[VerificationRecord]
    total: Total
    limit: int
    next_cursor: NextCursor
    chain_breaks: list[ChainBreak] = Field(
        description="links that do not hold between the records returned (checked when unfiltered)"
    )


class SystemBrief(Answer):
    hostname: str
    time: ApiTime
    identity_sha256: str
    source: str
    gpus: int
    cpu_model: str | None
    driver_version: str | None
    gpu_models: list[str | None]


class Systems(Answer):
    systems: list[SystemBrief]
    total: Total
    limit: int
    next_cursor: NextCursor


class SystemIdentity(Answer):
    hostname: str
    time: ApiTime
    identity_sha256: str
    record: StoredObject


class SystemAnnouncement(Answer):
    time: ApiTime
    identity_sha256: str
    source: str
    gpus: int
    record: StoredObject


class SystemHistory(Answer):
    hostname: str
    history: list[SystemAnnouncement]
    total: Total
    limit: int
    next_cursor: NextCursor

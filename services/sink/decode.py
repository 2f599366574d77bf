"""Turns consumed messages into a batch, and refuses bad ones with a reason.

A record that cannot be decoded or breaks the contract (shared.models) goes
to the dead-letter topic with headers naming the source topic, partition,
offset and the reason. It never blocks the valid records around it: its
offset still advances with the batch, once the dead letter is delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from shared.config import TopicSettings
from shared.errors import ContractError
from shared.models import parse_event

from .rows import GPU_UUID, stage_row
from .writer import Batch


@dataclass(slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    category: str  # a small fixed set, for the metric's label
    reason: str

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        return [
            ("dlq.source.topic", self.topic.encode()),
            ("dlq.source.partition", str(self.partition).encode()),
            ("dlq.source.offset", str(self.offset).encode()),
            ("dlq.category", self.category.encode()),
            ("dlq.error", self.reason.encode()[:4000]),
            ("dlq.failed_at", datetime.now(UTC).isoformat().encode()),
        ]


@dataclass(slots=True)
class Decoded:
    batch: Batch = field(default_factory=Batch)
    dead: list[DeadLetter] = field(default_factory=list)
    consumed: int = 0
    generation: int = 0  # the loop's rebalance generation when it was consumed
    started: float = 0.0  # perf_counter at decode, for the batch latency metric


class Record(Protocol):
    """What decode reads of a consumed message (confluent_kafka.Message has it all)."""

    def error(self) -> Any: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


def decode(
    messages: Sequence[Record], topics: TopicSettings, max_bytes: int, lanes: int = 1
) -> dict[int, Decoded]:
    """The messages as one batch per lane (partition % lanes); lanes without messages are absent.

    A GPU's samples share a partition (the key is its UUID), so different lanes never
    write the same rows and can be stored side by side.
    """
    out: dict[int, Decoded] = {}
    for msg in messages:
        if msg.error() is not None:
            continue  # consumer-level errors (e.g. a broker hiccup) are not records
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        lane = out.get(n := partition % lanes)
        if lane is None:
            lane = out[n] = Decoded()
        lane.consumed += 1
        next_offsets = lane.batch.next_offsets
        if offset >= next_offsets.get((topic, partition), 0):
            next_offsets[(topic, partition)] = offset + 1
        value, key = msg.value(), msg.key()
        refused: tuple[str, str] | None = None  # (category, reason)
        if value is None:
            refused = ("empty", "message has no value")
        elif len(value) > max_bytes:
            refused = ("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
        elif topic == topics.metrics_raw:
            try:
                row = stage_row(value)
            except ContractError as e:
                refused = ("contract", str(e))
            else:
                # the key must be the GPU's UUID (ASCII by the contract), or partitioning lies
                if key is None or key == row[GPU_UUID].encode():
                    lane.batch.rows.append(row)
                else:
                    refused = ("key", "message key does not match gpu_uuid")
        elif topic == topics.events:
            try:
                lane.batch.events.append(parse_event(value))
            except ContractError as e:
                refused = ("contract", str(e))
        else:
            refused = ("topic", f"the sink does not read topic {topic!r}")
        if refused is not None:
            lane.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return out

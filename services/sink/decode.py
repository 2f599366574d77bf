"""Turns consumed messages into a batch, and refuses bad ones with a reason.

A record that cannot be decoded or breaks the contract (shared.models) becomes
a dead letter, recorded with its batch (deadletters.py) and then sent to the
dead-letter topic with headers naming the source topic, partition, offset and
the reason. Whatever goes wrong with one record (RecursionError, MemoryError,
a bug) refuses that record and nothing else: it never blocks the valid records
around it, and its offset advances with the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.config import TopicSettings
from shared.errors import ContractError
from shared.models import parse_event

from .deadletters import DeadLetter
from .rows import GPU_UUID, stage_row
from .writer import Batch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decoded:
    batch: Batch = field(default_factory=Batch)
    consumed: int = 0
    generation: int = 0  # the loop's rebalance generation when it was consumed
    started: float = 0.0  # perf_counter at decode, for the batch latency metric

    @property
    def dead(self) -> list[DeadLetter]:
        """The records refused while decoding (they are recorded with the batch)."""
        return self.batch.dead


class Record(Protocol):
    """What decode reads of a consumed message (confluent_kafka.Message has it all)."""

    def error(self) -> Any: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


def decode_lanes(
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
        batch = lane.batch
        refused: tuple[str, str] | None = None  # (category, reason)
        try:
            if value is None:
                refused = ("empty", "message has no value")
            elif len(value) > max_bytes:
                refused = ("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
            # No parser here recurses unbounded: the compiled fast path declines nesting its types
            # do not have, and the contract's parsers check the depth (shared.jsonlimits) first.
            elif topic == topics.metrics_raw:
                try:
                    row = stage_row(value)
                except ContractError as e:
                    refused = ("contract", str(e))
                else:
                    # the key must be the GPU's UUID (ASCII by the contract), or partitioning lies
                    if key is None or key == row[GPU_UUID].encode():
                        batch.rows.append(row)
                        batch.row_origins.append((topic, partition, offset, key, value))
                    else:
                        refused = ("key", "message key does not match gpu_uuid")
            elif topic == topics.events:
                try:
                    batch.events.append(parse_event(value))
                    batch.event_origins.append((topic, partition, offset, key, value))
                except ContractError as e:
                    refused = ("contract", str(e))
            else:
                refused = ("topic", f"the sink does not read topic {topic!r}")
        except Exception as e:  # whatever it is, it is this record's and no one else's
            log.exception("record %s[%d]@%d could not be decoded", topic, partition, offset)
            refused = ("decode", f"{type(e).__name__}: {e}")
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return out

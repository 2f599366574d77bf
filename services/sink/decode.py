"""Turns consumed messages into a batch, and refuses bad ones with a reason.

A record that cannot be decoded or breaks the contract (shared.contract.models) becomes
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
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any, Protocol

from shared.contract.models import GpuEvent
from shared.contract.topic_registry import KeyMismatchError
from shared.plumbing.errors import ContractError
from shared.settings.common import TopicSettings

from .deadletters import DeadLetter, unreadable
from .partitions import note_stored
from .rows import STAGE_COLUMNS, TIME, stage_row, stage_rows
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

    A lane's samples are first decoded together (`_samples_at_once`): msgspec's passes over
    the whole lane rather than a Python step per message. That path takes only what is
    certainly fine; the moment anything in the lane is not (a value missing, too large, declined
    by the msgspec decoder, a key that does not match, an exception of any kind) every message
    of the lane is decoded on its own (`_decode_one`), which stores what pydantic accepts and
    refuses exactly the bad ones with their reasons. The two give the same batch.
    """
    records = [msg for msg in messages if msg.error() is None]  # consumer errors are not records
    by_lane: dict[int, list[Record]] = {0: records} if lanes == 1 and records else {}
    if lanes > 1:
        for msg, partition in zip(records, map(_PARTITION, records), strict=True):
            by_lane.setdefault((partition or 0) % lanes, []).append(msg)
    out: dict[int, Decoded] = {}
    for n, lane_records in by_lane.items():
        lane = out[n] = Decoded(consumed=len(lane_records))
        samples, others = lane_records, []
        names = list(map(_TOPIC, lane_records))
        if names.count(topics.metrics_raw) != len(names):
            samples = [m for m, name in zip(lane_records, names, strict=True) if name == topics.metrics_raw]
            others = [m for m, name in zip(lane_records, names, strict=True) if name != topics.metrics_raw]
        if not (samples and _samples_at_once(samples, topics.metrics_raw, lane.batch, max_bytes)):
            others = lane_records
        for msg in others:
            _decode_one(msg, lane.batch, topics, max_bytes)
    return out


_TOPIC, _PARTITION, _OFFSET = methodcaller("topic"), methodcaller("partition"), methodcaller("offset")
_KEY, _VALUE = methodcaller("key"), methodcaller("value")
_TIME = itemgetter(TIME)
METRICS_RAW = TopicSettings.entry("metrics_raw")
EVENTS = TopicSettings.entry("events")
_ROW_KEY = itemgetter(STAGE_COLUMNS.index(METRICS_RAW.key.field))  # the row's column the topic is keyed by


def _samples_at_once(records: list[Record], topic: str, batch: Batch, max_bytes: int) -> bool:
    """All of these records of the samples' `topic` into the batch, if every one is certainly valid.

    False, leaving the batch as it was, if any one is not (or anything at all goes wrong):
    then each is decoded on its own.
    """
    try:
        values = list(map(_VALUE, records))
        if None in values or max(map(len, values)) > max_bytes:
            return False
        rows = stage_rows(values)
        if rows is None:
            return False
        keys = list(map(_KEY, records))
        # each key must be its row's, as the registry keys the topic (ASCII by the contract), or
        # partitioning lies; the same list at once, else each through the registry's one check
        expected = list(map(_ROW_KEY, rows))
        if keys != list(map(str.encode, expected)) and not all(map(METRICS_RAW.key_matches, keys, expected)):
            return False
        partitions, offsets = list(map(_PARTITION, records)), list(map(_OFFSET, records))
        if None in partitions or None in offsets:
            return False
        origins = list(zip(repeat(topic), partitions, offsets, keys, values))
    except Exception:  # whatever it was, decoding one by one finds whose it is
        log.debug("decoding the lane at once failed; decoding each record", exc_info=True)
        return False
    batch.rows.extend(rows)
    batch.row_origins.extend(origins)
    # A partition's records come in offset order, so the last one seen is its newest (were they
    # not, a lower next offset would only make a restart re-read rows that are then skipped).
    # Per partition, its newest offset and that sample's time (the frontier, as one by one).
    newest = dict(zip(partitions, zip(offsets, map(_TIME, rows), strict=True), strict=True))
    note_stored(batch.next_offsets, {(topic, p): offset + 1 for p, (offset, _) in newest.items()})
    batch.frontiers.update({(topic, p): time for p, (_, time) in newest.items()})
    return True


def _decode_one(msg: Record, batch: Batch, topics: TopicSettings, max_bytes: int) -> None:
    """One record into the batch, or into its dead letters with the reason it was refused."""
    topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
    next_offsets = batch.next_offsets
    if offset >= next_offsets.get((topic, partition), 0):
        next_offsets[(topic, partition)] = offset + 1
    value, key = msg.value(), msg.key()
    refused = unreadable(value, max_bytes)  # (category, reason)
    if refused is None:
        assert value is not None  # unreadable() refuses a record without one
        try:
            # No parser here recurses unbounded: the msgspec decoder declines nesting its types
            # do not have, and the contract's parsers check the depth (gpuhealth.contract.jsonlimits) first.
            if topic == topics.metrics_raw:
                try:
                    row = stage_row(value)
                    METRICS_RAW.check_key(key, _ROW_KEY(row))  # or partitioning lies
                except KeyMismatchError as e:
                    refused = ("key", str(e))
                except ContractError as e:
                    refused = ("contract", str(e))
                else:
                    batch.rows.append(row)
                    batch.row_origins.append((topic, partition, offset, key, value))
                    batch.frontiers[(topic, partition)] = row[TIME]
            elif topic == topics.events:
                try:
                    batch.events.append(EVENTS.read(GpuEvent, value))
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

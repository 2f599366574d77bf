"""What the broker has not taken when the collector stops: kept on disk, sent first at the next start.

On SIGTERM the collector flushes for `shutdown_flush_s`. Whatever is still queued
then (the broker is away) is purged from librdkafka's queue and written, key, value
and headers byte for byte, to the spool file: a header line naming the spool, then
one JSON line per record, written to a temporary file, synced and renamed over the
old spool, so a crash mid-write leaves the previous spool whole. The file is bounded
(`spool_max_bytes`): what does not fit is dropped, newest first, and a log line at
ERROR says how many records and bytes were lost.

At the next start the spooled records are queued before the first poll. Each one
the broker acknowledges is appended to a `.delivered` file beside the spool (the
spool's id, then one index per line), so a collector that crashes halfway through a
replay resends, at its next start, only what was not acknowledged. When every
spooled record is acknowledged, both files are removed. What a crash can still
repeat is a record acknowledged by the broker in the instant before the crash,
before its line was written; its key and value are the original ones, so the sink
stores it once (its rows are keyed by GPU and time).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import confluent_kafka

from shared.plumbing.durable import fsync_dir
from shared.plumbing.errors import KafkaProduceError
from shared.plumbing.kafka import JsonProducer, make_consumer
from shared.settings.common import KafkaSettings

log = logging.getLogger(__name__)

FORMAT = "gpu-health-collector-spool"
VERSION = 1
PURGED = (confluent_kafka.KafkaError._PURGE_QUEUE, confluent_kafka.KafkaError._PURGE_INFLIGHT)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    return base64.b64decode(text, validate=True)


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    """One Kafka message exactly as it was queued."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    # The Kafka timestamp (CreateTime, ms) it was first produced with, and is resent with.
    timestamp_ms: int | None = None

    def to_line(self) -> bytes:
        fields = {
            "t": self.topic,
            "k": _b64(self.key),
            "v": _b64(self.value),
            "ts": self.timestamp_ms,
            "h": [[name, _b64(value)] for name, value in self.headers],
        }
        return json.dumps(fields, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> SpooledRecord:
        fields = json.loads(line)
        headers = tuple((str(name), _unb64(value)) for name, value in fields["h"])
        if not isinstance(fields["t"], str):
            raise ValueError("topic is not text")
        timestamp = fields.get("ts")
        if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)):
            raise ValueError("timestamp is not an integer")
        return cls(
            topic=fields["t"],
            key=_unb64(fields["k"]),
            value=_unb64(fields["v"]),
            headers=headers,
            timestamp_ms=timestamp,
        )


class SpoolFile:
    """The spool on disk: written whole, read back, its delivered records remembered across crashes."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.delivered_path = path.with_name(path.name + ".delivered")
        self._spool_id: str | None = None
        self._delivered: IO[bytes] | None = None

    def save(self, records: Sequence[SpooledRecord]) -> int:
        """Replace the spool with `records` (as many as the bound allows); returns how many were dropped."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        spool_id = uuid.uuid4().hex
        header = json.dumps({"format": FORMAT, "version": VERSION, "id": spool_id}).encode() + b"\n"
        lines, size = [header], len(header)
        for record in records:
            line = record.to_line()
            if size + len(line) > self.max_bytes:
                break
            lines.append(line)
            size += len(line)
        kept = len(lines) - 1
        if kept < len(records):
            lost = sum(len(r.to_line()) for r in records[kept:])
            log.error(
                "collector spool full: %d of %d queued messages (%d bytes) are lost; raise spool_max_bytes",
                len(records) - kept,
                len(records),
                lost,
                extra={"spool": str(self.path), "spool_max_bytes": self.max_bytes},
            )
        self.close()
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("wb") as out:
            out.writelines(lines)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        self.delivered_path.unlink(missing_ok=True)  # it spoke of the spool just replaced
        fsync_dir(self.path.parent)
        return len(records) - kept

    def load(self) -> list[tuple[int, SpooledRecord]]:
        """The spooled records not yet delivered, with their indexes; [] when there is no spool."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        header, *lines = raw.split(b"\n")
        try:
            meta = json.loads(header)
            if meta["format"] != FORMAT or meta["version"] != VERSION:
                raise ValueError(f"unknown spool format {meta.get('format')!r} v{meta.get('version')!r}")
            self._spool_id = str(meta["id"])
        except (ValueError, KeyError, TypeError) as e:
            log.error("collector spool %s is unreadable and is set aside: %s", self.path, e)
            os.replace(self.path, self.path.with_name(self.path.name + ".unreadable"))
            return []
        done = self._already_delivered()
        pending: list[tuple[int, SpooledRecord]] = []
        broken = 0
        for index, line in enumerate(lines):
            if not line or index in done:
                continue
            try:
                pending.append((index, SpooledRecord.from_line(line)))
            except (ValueError, KeyError, TypeError, binascii.Error):
                broken += 1
        if broken:
            log.error("collector spool %s: %d damaged records skipped", self.path, broken)
        return pending

    def _already_delivered(self) -> set[int]:
        try:
            spool_id, *indexes = self.delivered_path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return set()
        if spool_id.decode(errors="replace") != self._spool_id:
            return set()  # left over from an earlier spool
        # The last element follows the last newline: empty, or a line torn by a crash ("1" of "12").
        return {int(i) for i in indexes[:-1] if i.isdigit()}

    def mark_delivered(self, index: int) -> None:
        if self._delivered is None:
            fresh = not self.delivered_path.exists()
            self._delivered = self.delivered_path.open("ab")
            if fresh:
                self._delivered.write(f"{self._spool_id}\n".encode())
        self._delivered.write(f"{index}\n".encode())

    def sync(self) -> None:
        """Hand the delivered indexes written so far to the OS (they survive the process)."""
        if self._delivered is not None:
            self._delivered.flush()

    def close(self) -> None:
        if self._delivered is not None:
            self._delivered.close()
            self._delivered = None

    def remove(self) -> None:
        """Every spooled record was delivered: nothing is left to resend."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.delivered_path.unlink(missing_ok=True)


class _RecordingProducer:
    """librdkafka's producer as JsonProducer drives it, remembering every message until the broker settles it.

    librdkafka's delivery reports leave out headers, so each message's callback keeps
    the record itself; a message purged at shutdown is collected instead of counted as failed.
    """

    def __init__(self, producer: confluent_kafka.Producer) -> None:
        self._producer = producer
        self.purged: list[SpooledRecord] = []

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None,
        on_delivery: Callable[..., None],
        timestamp_ms: int | None = None,
    ) -> None:
        kept = tuple((name, v.encode() if isinstance(v, str) else v) for name, v in headers or ())
        # The timestamp is set here, not by librdkafka, so the spool knows it exactly.
        timestamp_ms = timestamp_ms or time.time_ns() // 1_000_000
        record = SpooledRecord(topic=topic, key=key, value=value, headers=kept, timestamp_ms=timestamp_ms)
        self._producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers,
            timestamp=timestamp_ms,
            on_delivery=partial(self._settle, record, on_delivery),
        )

    def _settle(
        self,
        record: SpooledRecord,
        on_delivery: Callable[..., None],
        err: confluent_kafka.KafkaError | None,
        msg: confluent_kafka.Message,
    ) -> None:
        if err is not None and err.code() in PURGED:
            self.purged.append(record)
        else:
            on_delivery(err, msg)

    def purge(self) -> list[SpooledRecord]:
        """Take every message not yet acknowledged out of the queue; returns them in queue order."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.flush(5)  # serves the purged messages' callbacks
        taken, self.purged = self.purged, []
        return taken

    def poll(self, timeout: float = 0.0) -> int:
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float = 30.0) -> int:
        return int(self._producer.flush(timeout))

    def __len__(self) -> int:
        return len(self._producer)


class SpoolingProducer(JsonProducer):
    """A JsonProducer whose queue can be taken out at shutdown and spooled, and refilled from a spool."""

    def __init__(self, producer: confluent_kafka.Producer) -> None:
        self._recording = _RecordingProducer(producer)
        super().__init__(self._recording)  # type: ignore[arg-type]

    def produce_record(self, record: SpooledRecord, on_delivered: Callable[[], None]) -> None:
        """Queue a spooled record as it was; `on_delivered` runs once the broker has it."""

        def settled(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            self._on_delivery(err, msg)
            if err is None:
                on_delivered()

        try:
            self._recording.produce(
                record.topic,
                value=record.value,
                key=record.key,
                headers=[(n, v) for n, v in record.headers] or None,
                on_delivery=settled,
                timestamp_ms=record.timestamp_ms,
            )
        except BufferError as e:
            raise KafkaProduceError("local producer queue is full", retriable=True) from e

    def purge(self) -> list[SpooledRecord]:
        return self._recording.purge()


def delivered_already(
    settings: KafkaSettings, pending: Sequence[tuple[int, SpooledRecord]], timeout_s: float
) -> set[int]:
    """The indexes of spooled records that are in Kafka already: sent, but never acknowledged.

    A message in flight when the broker went away may have been written without its
    acknowledgement arriving; purged and spooled, it would be written twice. So before
    resending, the topics are read from the oldest spooled timestamp to their end, and
    a record whose key and value are there is not resent. A read that cannot finish in
    `timeout_s` (the broker is still away) keeps what it found and says so.
    """
    stamps = [r.timestamp_ms for _, r in pending if r.timestamp_ms is not None]
    if not stamps:
        return set()
    wanted: dict[tuple[str, bytes | None, bytes | None], list[int]] = defaultdict(list)
    for index, r in pending:
        wanted[(r.topic, r.key, r.value)].append(index)
    found: set[int] = set()
    consumer = make_consumer(
        settings,
        group_id=f"gpu-health-spool-check-{uuid.uuid4().hex[:8]}",
        overrides={"enable.partition.eof": True},
    )
    deadline = time.monotonic() + timeout_s
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        starts = consumer.offsets_for_times(
            [
                confluent_kafka.TopicPartition(topic, partition, min(stamps))
                for topic in sorted({t for t, _, _ in wanted})
                if topic in metadata.topics
                for partition in metadata.topics[topic].partitions
            ],
            timeout=max(deadline - time.monotonic(), 1),
        )
        unread = {(tp.topic, tp.partition) for tp in starts if tp.offset >= 0}
        consumer.assign([tp for tp in starts if tp.offset >= 0])
        while unread and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        unread.discard((msg.topic() or "", msg.partition() or 0))
                    continue
                if indexes := wanted.get((msg.topic() or "", msg.key(), msg.value())):
                    found.add(indexes.pop())
        if unread:
            log.warning(
                "could not read Kafka back in time: spooled messages may be sent twice",
                extra={"partitions_unread": len(unread)},
            )
    except confluent_kafka.KafkaException as e:
        log.warning("could not read Kafka back: spooled messages may be sent twice: %s", e)
    finally:
        consumer.close()
    return found

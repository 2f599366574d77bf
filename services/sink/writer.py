"""Writes one batch in ONE transaction: rows, derived tables and the Kafka offsets together.

1. optimistically, under a savepoint, a binary COPY of the samples straight
   into gpu_metrics: a batch the database has never seen (the common case)
   goes in at COPY's cost;
2. only if that fails (a unique violation: a replay; or a value PostgreSQL
   refuses), back to the savepoint and the careful path: binary COPY into
   temporary staging tables, then INSERT ... SELECT ... ON CONFLICT DO
   NOTHING into the hypertables, so a replayed message adds nothing;
3. gpu_latest and gpu_assets from each GPU's newest row (staged, one per GPU),
   the events through staging and ON CONFLICT;
4. the minutes the batch stored samples in, as notes for the rollup's refresh
   (rollup.py recomputes them after the commit, outside the batch);
5. the batch's dead letters into sink_dead_letters (delivered to the
   dead-letter topic after the commit, see deadletters.py);
6. the next offset of every partition in the batch into kafka_offsets, never
   moving backwards.

Either all of it is committed or none of it is: offsets are never stored past
what is in the database, which is what makes restarts lossless and exact.

Every statement is shared.store's (samples, events, rollup, deadletters,
offsets); a driver failure comes out of it translated. If PostgreSQL refuses
the batch for a data reason (DataRefusedError), the batch is
split, inside the same transaction under savepoints, until each refused record
stands alone: those become dead letters carrying the database's error, the
rest is stored, and the offsets move on. Any other failure rolls everything
back and is the caller's to retry.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

import psycopg

from shared.contract.models import GpuEvent
from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, DatabaseUnavailableError, DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store import deadletters, events, offsets, rollup, samples
from shared.store.errors import translated
from shared.store.events import EVENTS_STAGE
from shared.store.offsets import Partition
from shared.store.samples import LATEST_STAGE, METRICS_STAGE, AlreadyStoredError

from .deadletters import DeadLetter, Origin
from .isolate import split_refused
from .rows import TIME, Row, event_row, newest_per_gpu

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WriteResult:
    metrics_inserted: int = 0
    events_inserted: int = 0
    dead_recorded: int = 0  # dead letters recorded with the batch, to deliver now
    # records the database refused (isolated and dead-lettered)
    refused_rows: int = 0
    refused_events: int = 0
    # the times of the samples stored: their minutes are noted for the rollup's refresh
    times: set[datetime] = field(default_factory=set)
    optimistic: bool = False  # the samples went in by the straight COPY


@dataclass(slots=True)
class Batch:
    rows: list[Row] = field(default_factory=list)  # samples as staging rows (rows.STAGE_COLUMNS)
    events: list[GpuEvent] = field(default_factory=list)
    next_offsets: dict[Partition, int] = field(default_factory=dict)
    # per partition, the time of its newest-offset sample in the batch (kafka_offsets.frontier)
    frontiers: dict[Partition, datetime] = field(default_factory=dict)
    # parallel to rows and events (absent: the record cannot be dead-lettered, only refused)
    row_origins: list[Origin] = field(default_factory=list)
    event_origins: list[Origin] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)  # refused before the database saw them


_Item = tuple[Row | None, GpuEvent | None, Origin | None]  # one record of a batch being split


_TIMES = itemgetter(TIME)
_STAGES = (METRICS_STAGE, LATEST_STAGE, EVENTS_STAGE)


class EarlierBatchError(DatabaseError):
    """The batch before this one was not stored, so this one was not either (offsets stay in order)."""


class BatchWriter:
    """Writes batches over a few database connections, one batch per connection at a time.

    A write can be told what to wait for once its rows are staged and before its
    statements run (the previous batch of the same partitions): so the next batch
    is COPYed while the previous one's statements run, yet they commit in order,
    and never after one before them failed. Broken connections are replaced.
    """

    def __init__(
        self,
        settings: DatabaseSettings,
        *,
        group: str,
        statement_timeout_ms: int = 60_000,
        connections: int = 4,
    ) -> None:
        self.settings, self.group = settings, group
        self.statement_timeout_ms = statement_timeout_ms
        self.connections = connections
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(connections):
            self._free.put(slot)
        # One connection per concurrent write, and one more (the last) for reading stored
        # offsets, so that never commits in the middle of a batch's transaction.
        self._conns: list[psycopg.Connection[tuple[object, ...]] | None] = [None] * (connections + 1)

    def _connection(self, slot: int) -> psycopg.Connection[tuple[object, ...]]:
        conn = self._conns[slot]
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._close(slot)
        conn = connect(self.settings)
        try:
            samples.prepare_writer_session(conn, _STAGES, self.statement_timeout_ms)
        except DatabaseError as e:
            conn.close()
            raise DatabaseUnavailableError(f"preparing the sink's session failed: {e}") from e
        self._conns[slot] = conn
        return conn

    def stored_offsets(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """The next offsets this group stored for the given partitions (absent: never written)."""
        conn = self._connection(self.connections)
        try:
            return offsets.stored(conn, self.group, partitions)
        except DatabaseError as e:
            self._fail(self.connections)
            raise DatabaseError(f"reading stored offsets failed: {e}") from e

    def write(self, batch: Batch, after: Callable[[], object] | None = None) -> WriteResult:
        """Store the batch and its offsets atomically; DatabaseError leaves nothing behind.

        `after` is called once the rows are staged and before anything else: it waits
        for the previous batch and raises if that was not stored. At most
        `connections` writes may run at once.
        """
        slot = self._free.get()
        try:
            return self._write(slot, batch, after)
        finally:
            self._free.put(slot)

    def _write(self, slot: int, batch: Batch, after: Callable[[], object] | None) -> WriteResult:
        conn = self._connection(slot)
        result = WriteResult()
        try:
            with conn.cursor() as cur:
                samples.savepoint(cur, "batch")
                # What is small is staged while the batch before runs its statements.
                fault = self._stage(cur, batch.rows, batch.events, only_newest=True)
                if after is not None:
                    try:
                        after()
                    except Exception as e:
                        raise EarlierBatchError(f"not stored, as the batch before it was not: {e}") from e
                if fault is None:
                    # After the batch before it is stored: the straight COPY may then wait on
                    # nothing of this lane, so the two can never deadlock over a shared key.
                    fault = self._optimistic(cur, result, batch)
                if fault is not None:  # a replay, or a value refused: the careful path
                    samples.rollback_to(cur, "batch")
                    result = WriteResult()
                    fault = self._stage(cur, batch.rows, batch.events) or self._insert(
                        cur, result, batch.rows, batch.events
                    )
                dead = batch.dead
                if fault is not None:
                    samples.rollback_to(cur, "batch")
                    log.warning("batch refused by the database, isolating the records: %s", fault)
                    result = WriteResult()
                    dead = [*dead, *self._isolate(cur, result, batch)]
                rollup.note_minutes(cur, result.times)
                result.dead_recorded = deadletters.record(cur, self.group, dead)
                offsets.store(cur, self.group, batch.next_offsets, batch.frontiers)
            with translated(conn):
                conn.commit()
        except EarlierBatchError:
            self._fail(slot)
            raise
        except DatabaseError as e:
            self._fail(slot)
            raise DatabaseError(f"batch write failed: {e}") from e
        except Exception as e:  # e.g. a value psycopg could not send over a connection that broke
            self._fail(slot)
            raise DatabaseError(f"batch write failed ({type(e).__name__}): {e}") from e
        return result

    def _optimistic(
        self, cur: psycopg.Cursor[tuple[object, ...]], result: WriteResult, batch: Batch
    ) -> DataRefusedError | None:
        """The samples by a binary COPY straight into gpu_metrics, then what derives from them.

        The rows' newest-per-GPU and the events are already staged. A data fault (a
        unique violation: the batch was stored before; or a value refused) is returned
        for the caller to go back to the savepoint and take the careful path.
        """
        try:
            if batch.rows:
                samples.copy_straight(cur, batch.rows)
                result.metrics_inserted = len(batch.rows)
                result.times.update(map(_TIMES, batch.rows))
                result.optimistic = True
                self._derived(cur, result, batch.events, latest=True)
            elif batch.events:
                self._derived(cur, result, batch.events, latest=False)
        except AlreadyStoredError as e:
            return e
        except DataRefusedError as e:
            log.info("the straight COPY was refused, taking the careful path: %s", e)
            return e
        return None

    def _derived(
        self,
        cur: psycopg.Cursor[tuple[object, ...]],
        result: WriteResult,
        gpu_events: list[GpuEvent],
        *,
        latest: bool,
    ) -> None:
        """gpu_latest and gpu_assets from the staged newest rows; the staged events."""
        if latest:
            samples.upsert_latest_and_assets(cur)
        if gpu_events:
            result.events_inserted += events.insert_staged(cur)

    def _stage(
        self,
        cur: psycopg.Cursor[tuple[object, ...]],
        rows: list[Row],
        events: list[GpuEvent],
        *,
        only_newest: bool = False,
    ) -> DataRefusedError | None:
        """COPY the records into the staging tables; the data fault that stopped it, if any.

        Each GPU's newest sample is staged for gpu_latest and gpu_assets; with `only_newest`,
        no other (the straight COPY takes them all into gpu_metrics).
        """
        try:
            if rows and not only_newest:
                METRICS_STAGE.copy_rows(cur, rows)
            if rows:
                LATEST_STAGE.copy_rows(cur, newest_per_gpu(rows))
            if events:
                EVENTS_STAGE.copy_rows(cur, map(event_row, events))
        except DataRefusedError as e:
            return e
        return None

    def _insert(
        self,
        cur: psycopg.Cursor[tuple[object, ...]],
        result: WriteResult,
        rows: list[Row],
        events: list[GpuEvent],
    ) -> DataRefusedError | None:
        """From the staging tables into the hypertables; the data fault that stopped it, if any."""
        try:
            if rows:
                result.metrics_inserted += samples.insert_staged(cur)
                result.times.update(map(_TIMES, rows))
            self._derived(cur, result, events, latest=bool(rows))
        except DataRefusedError as e:
            return e
        return None

    def _isolate(
        self, cur: psycopg.Cursor[tuple[object, ...]], result: WriteResult, batch: Batch
    ) -> list[DeadLetter]:
        """Store the batch's records part by part, halving a refused part until its culprits stand alone."""
        items: list[_Item] = [
            *((row, None, origin) for row, origin in _with_origins(batch.rows, batch.row_origins)),
            *((None, event, origin) for event, origin in _with_origins(batch.events, batch.event_origins)),
        ]

        def store_part(part: list[_Item]) -> DataRefusedError | None:
            rows = [row for row, _, _ in part if row is not None]
            events = [event for _, event, _ in part if event is not None]
            samples.savepoint(cur, "part")
            samples.truncate_stages(cur, _STAGES)
            stored = WriteResult()
            fault = self._stage(cur, rows, events) or self._insert(cur, stored, rows, events)
            if fault is not None:
                samples.rollback_to(cur, "part", release=True)
                return fault
            samples.release(cur, "part")
            result.metrics_inserted += stored.metrics_inserted
            result.events_inserted += stored.events_inserted
            result.times |= stored.times
            return None

        refused: list[DeadLetter] = []
        for (row, _, origin), fault in split_refused(items, store_part):
            if row is not None:
                result.refused_rows += 1
            else:
                result.refused_events += 1
            if origin is None:
                raise DatabaseError(f"a record without its origin was refused: {fault}") from fault
            topic, partition, offset, key, value = origin
            refused.append(DeadLetter(key, value, topic, partition, offset, "database", str(fault)))
        return refused

    def _fail(self, slot: int) -> None:
        conn = self._conns[slot]
        try:
            if conn is not None:
                conn.rollback()
        except psycopg.Error:
            self._close(slot)

    def _close(self, slot: int) -> None:
        conn, self._conns[slot] = self._conns[slot], None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for slot in range(len(self._conns)):
            self._close(slot)


def _with_origins(records: list[Any], origins: list[Origin]) -> Iterable[tuple[Any, Origin | None]]:
    if len(origins) == len(records):
        return zip(records, origins, strict=True)
    return ((record, None) for record in records)

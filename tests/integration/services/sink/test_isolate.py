"""The writer on the real database: a batch PostgreSQL refuses is split until the culprits stand alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from evaluation.pipeline import stored_offsets_total
from services.sink.deadletters import DeadLetter, Origin
from services.sink.rows import STAGE_COLUMNS, stage_row
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import EventKind, GpuEvent, Source
from shared.fakes.samples import sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.sink import count

HOSTNAME = STAGE_COLUMNS.index("hostname")


def with_hostname(row: tuple[Any, ...], hostname: str) -> tuple[Any, ...]:
    return (*row[:HOSTNAME], hostname, *row[HOSTNAME + 1 :])


def event(i: int, details: dict[str, Any]) -> GpuEvent:
    """An event as a buggy producer would build it: model_construct skips the contract."""
    return GpuEvent.model_construct(
        schema_version=1, time=datetime(2026, 11, 1, 0, 0, i, tzinfo=UTC), kind=EventKind.XID,
        gpu_uuid="GPU-00000000-0000-4000-8000-000000000000", hostname="h", source=Source.MOCK,
        collector_id="c", cluster=None, datacenter=None, rack=None, details=details,
    )  # fmt: skip


def test_records_the_database_refuses_are_isolated_and_everything_else_is_stored(
    migrated: DatabaseSettings,
) -> None:
    writer = BatchWriter(migrated, group="g", connections=1)
    rows = [stage_row(json.dumps(sample(i)).encode()) for i in range(40)]
    rows[3] = with_hostname(rows[3], "a\x00b")  # text PostgreSQL refuses (22021)
    rows[17] = with_hostname(rows[17], "a\ud800b")  # text psycopg cannot even encode
    rows[18] = with_hostname(rows[18], "\x00")  # next to another culprit
    events = [event(i, {"xid": 79}) for i in range(5)]
    events[2] = event(2, {"xid": "\x00"})  # jsonb refuses \u0000 (22P05)
    row_origins: list[Origin] = [("raw", 0, i, b"k%d" % i, b"v%d" % i) for i in range(40)]
    event_origins: list[Origin] = [("ev", 1, i, None, b"e%d" % i) for i in range(5)]
    decoded_dead = [DeadLetter(None, b"{oops", "raw", 0, 40, "contract", "value is not JSON")]
    batch = Batch(
        rows=rows, events=events, next_offsets={("raw", 0): 41, ("ev", 1): 5},
        row_origins=row_origins, event_origins=event_origins, dead=decoded_dead,
    )  # fmt: skip
    try:
        result = writer.write(batch)
        again = writer.write(batch)  # a replay of the same records adds nothing, dead letters included
    finally:
        writer.close()
    assert (result.metrics_inserted, result.events_inserted) == (37, 4)
    assert (result.refused_rows, result.refused_events, result.dead_recorded) == (3, 1, 5)
    assert (again.metrics_inserted, again.events_inserted) == (0, 0)
    assert count(migrated, "gpu_metrics") == 37
    assert count(migrated, "gpu_events") == 4
    assert stored_offsets_total(migrated, "g") == 41 + 5
    with connect(migrated) as conn:
        dead = conn.execute(
            "SELECT source_topic, source_offset, category, reason, value FROM sink_dead_letters ORDER BY 1, 2"
        ).fetchall()
    assert [(t, o, c) for t, o, c, _, _ in dead] == [
        ("ev", 2, "database"), ("raw", 3, "database"), ("raw", 17, "database"), ("raw", 18, "database"),
        ("raw", 40, "contract"),
    ]  # fmt: skip
    reasons = {o: str(r) for _, o, _, r, _ in dead}
    assert "22P05" in reasons[2]  # the database's own error
    assert "22021" in reasons[3]
    assert "UnicodeEncodeError" in reasons[17]
    assert dead[1][4] == b"v3"  # the original value, to be sent as the dead letter


def test_a_batch_that_fails_for_no_record_is_not_split_into_dead_letters(migrated: DatabaseSettings) -> None:
    """A failure no single record explains (here the offsets) stores nothing and dead-letters nothing."""
    writer = BatchWriter(migrated, group="g", connections=1)
    rows = [stage_row(json.dumps(sample(i)).encode()) for i in range(10)]
    origins: list[Origin] = [("raw", 0, i, None, b"v") for i in range(10)]
    try:
        try:
            writer.write(Batch(rows=rows, next_offsets={("raw", 0): -1}, row_origins=origins))
        except Exception as e:
            error: Exception | None = e
        else:
            error = None
    finally:
        writer.close()
    assert error is not None
    assert "next_offset" in str(error)
    assert count(migrated, "gpu_metrics") == 0
    with connect(migrated) as conn:
        assert conn.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)

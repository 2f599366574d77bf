"""shared.store.archive on the real TimescaleDB: chunks, sizes, binary copies, translated failures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store.archive import (
    arrow_schema,
    chunk_relations,
    columns_of,
    copy_batches,
    count_rows,
    expired_chunks,
    hypertable_bytes,
    live_rows,
    load_rows_binary,
    read_chunks_binary,
    time_column_of,
)

COLUMNS = ("time", "gpu_uuid", "hostname", "source", "collector_id", "gpu_temp_c")
TYPES = ("timestamptz", "text", "text", "text", "text", "float8")
START = datetime(2026, 1, 1, tzinfo=UTC)


def readings(hours: int) -> list[tuple[object, ...]]:
    """One reading an hour for two GPUs, from START."""
    return [
        (START + timedelta(hours=h), f"GPU-{g}", "node-0", "mock", "itest", 40.0 + h % 7)
        for h in range(hours)
        for g in (1, 2)
    ]


def test_rows_loaded_by_binary_copy_are_in_chunks_that_list_size_and_copy_out(
    migrated: DatabaseSettings,
) -> None:
    rows = readings(48)
    with connect(migrated) as conn:
        load_rows_binary(conn, "gpu_metrics", COLUMNS, TYPES, rows)
        conn.commit()
        chunks = chunk_relations(conn, "gpu_metrics")
        total, heap = hypertable_bytes(conn, "gpu_metrics")
        read_chunks_binary(conn, chunks)
        expired = expired_chunks(conn, "gpu_metrics", START + timedelta(days=30))
        counted = sum(count_rows(conn, chunk) for chunk in expired)
    assert len(chunks) > 1
    assert [f"{c.schema}.{c.name}" for c in expired] == chunks  # the same chunks, oldest first
    assert [c.start for c in expired] == sorted(c.start for c in expired)
    assert counted == len(rows)
    assert total >= heap > 0


def test_an_empty_hypertable_has_no_chunks_and_no_bytes(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        assert chunk_relations(conn, "gpu_metrics") == []
        assert hypertable_bytes(conn, "gpu_metrics") == (0, 0)
        assert expired_chunks(conn, "gpu_metrics", datetime.now(UTC)) == []


def test_a_refused_row_leaves_as_data_refused_and_nothing_is_written(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        with pytest.raises(DataRefusedError):
            load_rows_binary(conn, "gpu_metrics", COLUMNS, TYPES, [(START, None, "n", "mock", "c", 1.0)])
        conn.rollback()
        assert chunk_relations(conn, "gpu_metrics") == []


def test_a_missing_relation_leaves_as_the_projects_error_not_the_drivers(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        with pytest.raises(DatabaseError):
            columns_of(conn, "no_such_table")
        conn.rollback()
        with pytest.raises(DatabaseError):
            list(
                copy_batches(
                    conn, sql.Identifier("no_such_table"), [("x", "text")], arrow_schema([("x", "text")])
                )
            )


def test_live_rows_start_at_since_and_name_the_time_column(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        load_rows_binary(conn, "gpu_metrics", COLUMNS, TYPES, readings(10))
        conn.commit()
        table, time_column = live_rows(conn, "gpu_metrics", START + timedelta(hours=6))
        assert time_column_of(conn, "gpu_metrics_1min") == "bucket"
        assert time_column_of(conn, "kafka_offsets") == "time"  # not a hypertable
    assert time_column == "time"
    assert table.num_rows == 8  # hours 6..9, two GPUs
    assert min(table.column("time").to_pylist()) == START + timedelta(hours=6)

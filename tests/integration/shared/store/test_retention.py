"""shared.store.retention on the real TimescaleDB: the per-schema lock, exact drops, a chunk's SHARE lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.settings.common import DatabaseSettings
from shared.store import retention
from shared.store.archive import Chunk, chunk_relations, expired_chunks, load_rows_binary

COLUMNS = ("time", "gpu_uuid", "hostname", "source", "collector_id")
TYPES = ("timestamptz", "text", "text", "text", "text")
START = datetime(2026, 1, 1, tzinfo=UTC)


def fill(db: DatabaseSettings, hours: int = 48) -> list[Chunk]:
    """A reading an hour from START (several chunks); the chunks, oldest first."""
    rows = [(START + timedelta(hours=h), "GPU-1", "n", "mock", "itest") for h in range(hours)]
    with connect(db) as conn:
        load_rows_binary(conn, "gpu_metrics", COLUMNS, TYPES, rows)
        conn.commit()
        return expired_chunks(conn, "gpu_metrics", START + timedelta(days=30))


def test_one_session_per_schema_holds_the_retention_lock(migrated: DatabaseSettings) -> None:
    with connect(migrated, autocommit=True) as first, connect(migrated, autocommit=True) as second:
        assert retention.try_retention_lock(first)
        assert not retention.try_retention_lock(second)
        retention.release_retention_lock(first)
        assert retention.try_retention_lock(second)
        retention.release_retention_lock(second)


def test_a_range_wider_than_its_chunk_is_not_dropped_by_range(migrated: DatabaseSettings) -> None:
    first, second, *_ = fill(migrated)
    stretched = Chunk(first.hypertable, first.schema, first.name, first.start, second.end, first.time_column)
    with connect(migrated, autocommit=True) as conn:
        assert not retention.range_holds_only(conn, stretched)
        assert retention.range_holds_only(conn, first)
        assert retention.drop_chunk_range(conn, first) == 1
        assert f"{first.schema}.{first.name}" not in chunk_relations(conn, "gpu_metrics")
        assert retention.drop_chunks_older_than(conn, "gpu_metrics", START + timedelta(days=30)) >= 1
        assert chunk_relations(conn, "gpu_metrics") == []


def test_rows_for_a_share_locked_chunk_wait_for_the_commit(migrated: DatabaseSettings) -> None:
    chunk = fill(migrated)[0]
    late = (chunk.start + timedelta(minutes=1), "GPU-late", "n", "mock", "itest")
    with connect(migrated) as holder, connect(migrated) as writer:
        with retention.share_locked(holder, chunk):
            writer.execute("SET lock_timeout = '200ms'")
            with pytest.raises(DatabaseError):  # the late row would wait: here it gives up
                load_rows_binary(writer, "gpu_metrics", COLUMNS, TYPES, [late])
            writer.rollback()
        load_rows_binary(writer, "gpu_metrics", COLUMNS, TYPES, [late])
        writer.commit()


def drop_then_fail(conn: psycopg.Connection[tuple[object, ...]], chunk: Chunk) -> None:
    with retention.share_locked(conn, chunk):
        assert retention.drop_chunk_range(conn, chunk) == 1
        raise ValueError("not the driver's")


def test_an_error_in_the_locked_block_leaves_unchanged_and_rolls_the_drop_back(
    migrated: DatabaseSettings,
) -> None:
    chunk = fill(migrated)[0]
    with connect(migrated, autocommit=True) as conn:
        with pytest.raises(ValueError, match="not the driver's"):
            drop_then_fail(conn, chunk)
        assert f"{chunk.schema}.{chunk.name}" in chunk_relations(conn, "gpu_metrics")


def test_vacuum_needs_autocommit_and_says_so_as_a_database_error(migrated: DatabaseSettings) -> None:
    with connect(migrated, autocommit=True) as conn:
        retention.vacuum_analyze(conn, "gpu_metrics")
    with connect(migrated) as conn, pytest.raises(DatabaseError) as refused:
        retention.vacuum_analyze(conn, "gpu_metrics")
    assert not isinstance(refused.value, psycopg.Error)


def test_without_the_timescale_license_no_rollup_job_has_run(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        assert retention.last_rollup_refresh(conn) is None

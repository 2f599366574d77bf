"""shared.store.migrations and .server on the real PostgreSQL: bookkeeping, rollback, throwaway schemas."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, DatabaseUnavailableError
from shared.settings.common import DatabaseSettings
from shared.store import migrations
from shared.store.server import create_schema, drop_schema, set_search_path


def test_a_failing_migration_leaves_nothing_and_is_not_recorded(
    db_conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    assert migrations.recorded_checksums(db_conn) == {}
    migrations.apply_migration(
        db_conn, version=1, name="a", checksum="c1", statements="CREATE TABLE a (x int)"
    )
    with pytest.raises(DatabaseError):
        migrations.apply_migration(
            db_conn,
            version=2,
            name="b",
            checksum="c2",
            statements="CREATE TABLE b (x int); SELECT no_such_fn()",
        )
    assert migrations.recorded_checksums(db_conn) == {1: "c1"}
    assert db_conn.execute("SELECT to_regclass('b')").fetchone() == (None,)


def test_the_runners_lock_is_released(db_conn: psycopg.Connection[tuple[object, ...]]) -> None:
    migrations.lock_runners(db_conn)
    migrations.unlock_runners(db_conn)
    held = db_conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    )
    assert held.fetchone() == (0,)


def test_a_throwaway_schema_is_created_and_dropped_with_its_tables(db_settings: DatabaseSettings) -> None:
    name = f"test_store_{uuid.uuid4().hex[:8]}"
    with connect(db_settings) as conn:  # autocommit off: the functions commit
        create_schema(conn, name)
        set_search_path(conn, name)
        conn.execute("CREATE TABLE t (x int)")
        conn.commit()
        drop_schema(conn, name)
        assert conn.execute("SELECT to_regnamespace(%s)", (name,)).fetchone() == (None,)
        with pytest.raises(DatabaseError):
            drop_schema(conn, name)


def test_a_closed_connection_is_unavailable_not_a_driver_error(db_settings: DatabaseSettings) -> None:
    conn = connect(db_settings)
    conn.close()
    with pytest.raises(DatabaseUnavailableError):
        set_search_path(conn, "public")

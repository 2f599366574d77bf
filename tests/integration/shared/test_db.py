"""Migrations and TimescaleDB on the real server."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from shared.plumbing.db import connect
from shared.plumbing.errors import MigrationError
from shared.plumbing.migrate import apply_migrations, discover
from shared.settings.common import DatabaseSettings
from shared.store.server import timescale_info

Conn = psycopg.Connection[tuple[object, ...]]


def test_migrations_apply_once_and_the_second_run_is_a_no_op(db_conn: Conn) -> None:
    migrations = discover()
    assert migrations, "schema/ has no migrations"
    first = apply_migrations(db_conn, migrations)
    assert [m.version for m in first] == [m.version for m in migrations]
    assert apply_migrations(db_conn, migrations) == []
    rows = db_conn.execute("SELECT version, checksum FROM schema_migrations ORDER BY version").fetchall()
    assert rows == [(m.version, m.checksum) for m in migrations]


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_failing_migration_leaves_nothing_half_applied(db_conn: Conn, tmp_path: Path) -> None:
    folder = write(
        tmp_path,
        {
            "0001_good.sql": "CREATE TABLE good (id int);",
            "0002_bad.sql": "CREATE TABLE half (id int); SELECT no_such_function();",
        },
    )
    with pytest.raises(MigrationError, match=r"0002_bad\.sql failed"):
        apply_migrations(db_conn, discover(folder))
    tables = {
        r[0]
        for r in db_conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    }
    assert tables == {"good", "schema_migrations"}
    assert db_conn.execute("SELECT array_agg(version) FROM schema_migrations").fetchone() == ([1],)


def test_an_applied_migration_that_was_edited_is_refused(db_conn: Conn, tmp_path: Path) -> None:
    folder = write(tmp_path, {"0001_t.sql": "CREATE TABLE t (id int);"})
    apply_migrations(db_conn, discover(folder))
    write(folder, {"0001_t.sql": "CREATE TABLE t (id bigint);"})
    with pytest.raises(MigrationError, match="changed after it was applied"):
        apply_migrations(db_conn, discover(folder))


def test_concurrent_runners_apply_each_migration_once(
    db_settings: DatabaseSettings, db_schema: str, tmp_path: Path
) -> None:
    folder = write(tmp_path, {f"{i:04d}_m{i}.sql": f"CREATE TABLE m{i} (id int);" for i in range(1, 6)})
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with connect(db_settings, schema=db_schema) as conn:
                applied.append([m.version for m in apply_migrations(conn, discover(folder))])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(v for batch in applied for v in batch) == [1, 2, 3, 4, 5]


def test_hypertable_time_bucket_and_license(db_conn: Conn) -> None:
    apply_migrations(db_conn, discover())
    info = timescale_info(db_conn)
    shown = db_conn.execute("SHOW timescaledb.license").fetchone()
    assert shown == (info.license,)
    assert info.license in {"apache", "timescale"}
    assert info.version.split(".")[0] == "2"
    db_conn.execute("CREATE TABLE samples (time timestamptz NOT NULL, gpu text NOT NULL, temp_c real)")
    db_conn.execute(
        "SELECT public.create_hypertable('samples', 'time', chunk_time_interval => interval '1 hour')"
    )
    db_conn.execute(
        "INSERT INTO samples SELECT '2026-01-01'::timestamptz + g * interval '10 s', 'GPU-a', g"
        " FROM generate_series(0, 719) g"
    )
    buckets = db_conn.execute(
        "SELECT public.time_bucket('1 hour', time) b, count(*), avg(temp_c)"
        " FROM samples GROUP BY b ORDER BY b"
    ).fetchall()
    assert [(c, float(str(a))) for _, c, a in buckets] == [(360, 179.5), (360, 539.5)]
    chunks = db_conn.execute("SELECT count(*) FROM public.show_chunks('samples')").fetchone()
    assert chunks == (2,)
    dropped = db_conn.execute(
        "SELECT count(*) FROM public.drop_chunks('samples', older_than => '2026-01-01 01:00'::timestamptz)"
    ).fetchone()
    assert dropped == (1,)
    assert db_conn.execute("SELECT count(*) FROM samples").fetchone() == (360,)

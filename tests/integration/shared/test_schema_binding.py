"""A service bound to a schema reaches that schema's tables and no other's, whatever `public` holds.

Its search_path is the schema alone; TimescaleDB's functions are called as `public.*` (migration 0020
qualifies the calls in the schema's own functions). A half-migrated schema is refused at start, and a
table that goes missing while a service runs fails its statement: nothing lands in `public`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, MigrationError
from shared.plumbing.migrate import apply_migrations, check_migrated, discover
from shared.settings.common import DatabaseSettings
from shared.store import verifications
from tests.paths import REPO

UNQUALIFIED = r"(?<![.[:alnum:]_])(time_bucket|drop_chunks|show_chunks|create_hypertable)\("


@pytest.fixture
def decoy_in_public(db_settings: DatabaseSettings) -> Iterator[str]:
    """A table in `public` with one row, under a name no schema of the test has."""
    name = f"decoy_{uuid.uuid4().hex[:12]}"
    with connect(db_settings, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE public.{} (x int)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("INSERT INTO public.{} VALUES (1)").format(sql.Identifier(name)))
    yield name
    with connect(db_settings, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(name)))


def test_a_bound_connection_does_not_see_a_table_of_public(
    migrated: DatabaseSettings, decoy_in_public: str
) -> None:
    with connect(migrated) as conn:
        (schemas,) = conn.execute("SELECT current_schemas(false)").fetchone() or (None,)
        assert schemas == [migrated.search_path]
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute(sql.SQL("SELECT x FROM {}").format(sql.Identifier(decoy_in_public)))
        conn.rollback()
        # the functions the project calls are still found, by their schema
        (bucket,) = conn.execute(
            "SELECT public.time_bucket('1 minute', '2026-01-01 00:00:30+00'::timestamptz)"
        )
        assert bucket[0] == datetime(2026, 1, 1, tzinfo=UTC)


def test_no_function_of_a_migrated_schema_calls_timescaledb_unqualified(migrated: DatabaseSettings) -> None:
    """A bound session would not find such a call; a new migration that adds one fails here."""
    with connect(migrated) as conn:
        rows = conn.execute(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace"
            " AND p.prokind = 'f' AND pg_get_functiondef(p.oid) ~ %s",
            (UNQUALIFIED,),
        ).fetchall()
        assert rows == []
        # and the rollup's refresh runs in the bound session
        conn.execute("SELECT gpu_metrics_1min_refresh(interval '1 day')")


def test_a_table_gone_while_running_fails_the_statement_and_writes_nowhere_else(
    migrated: DatabaseSettings, db_settings: DatabaseSettings
) -> None:
    """The sink's retry tests take a table away like this; with `public` on the path, writes landed there."""
    public_rows = _public_count(db_settings, "gpu_systems")
    with connect(migrated) as conn:
        conn.execute("ALTER TABLE gpu_systems RENAME TO gpu_systems_away")
        conn.commit()
        row = ("node-1", datetime.now(UTC), "0" * 64, "mock", 1, "{}")
        with pytest.raises(DatabaseError, match="gpu_systems"), conn.cursor() as cur:
            verifications.insert_system(cur, row)
        conn.rollback()
    assert _public_count(db_settings, "gpu_systems") == public_rows


@pytest.fixture
def half_migrated(db_settings: DatabaseSettings, db_schema: str) -> DatabaseSettings:
    """A schema with the migrations before 0009 (no gpu_systems, no verifications, no rollup refresh)."""
    scoped = db_settings.model_copy(update={"search_path": db_schema})
    with connect(scoped) as conn:
        apply_migrations(conn, [m for m in discover() if m.version < 9])
    return scoped


def test_the_start_check_names_what_a_half_migrated_schema_lacks(half_migrated: DatabaseSettings) -> None:
    with connect(half_migrated) as conn, pytest.raises(MigrationError) as refused:
        check_migrated(conn)
    message = str(refused.value)
    assert str(half_migrated.search_path) in message
    later = [f"{m.version:04d}_{m.name}" for m in discover() if m.version >= 9]
    assert re.findall(r"\d{4}_[a-z0-9_]+", message.split("lacks migrations", 1)[1]) == later


def test_the_start_check_refuses_a_schema_without_migrations(
    db_settings: DatabaseSettings, db_schema: str
) -> None:
    bound = db_settings.model_copy(update={"search_path": db_schema})
    with connect(bound) as conn, pytest.raises(MigrationError, match="holds no migrations"):
        check_migrated(conn)


def test_the_start_check_passes_a_migrated_schema(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        check_migrated(conn)


@pytest.mark.parametrize("module", ["services.sink", "services.scorer"])
def test_a_service_bound_to_a_half_migrated_schema_refuses_to_start_and_writes_nothing(
    half_migrated: DatabaseSettings, module: str
) -> None:
    """Its Kafka address is unreachable on purpose: the check comes first, so nothing is ever read."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "OTEL_"))}
    env = {
        **clean, "PYTHONPATH": str(REPO),
        "GPUHEALTH_DB__HOST": half_migrated.host, "GPUHEALTH_DB__PORT": str(half_migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": str(half_migrated.search_path),
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",  # never reached: the check comes first
        "GPUHEALTH_SINK__METRICS_PORT": "0", "GPUHEALTH_SCORER__METRICS_PORT": "0",
        "GPUHEALTH_LOG__JSON": "false",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "lacks migrations 0009_verifications_and_systems" in done.stdout + done.stderr
    with connect(half_migrated) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_metrics").fetchone() == (0,)


def _public_count(db: DatabaseSettings, table: str) -> int | None:
    """Rows in public.`table`, None where it does not exist (no `make up` on this database)."""
    with connect(db.model_copy(update={"search_path": None})) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{table}",)).fetchone()
        if not (row and row[0]):
            return None
        counted = conn.execute(
            sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))
        ).fetchone()
    return int(str(counted[0])) if counted else None

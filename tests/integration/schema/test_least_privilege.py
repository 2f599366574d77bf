"""The API's database logins, tried as an attacker holding their passwords would (migration 0012).

The reader reads what the API and the dashboards show, and every other thing it
tries -- writing a table, a large object, a temporary table, a function, calling the
acknowledge function -- is refused by PostgreSQL. Acknowledging takes the
acknowledger login, which can do that and nothing else.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from services.api.app import acknowledger_settings, reader_settings
from services.api.settings import ApiSection
from shared.plumbing.db import connect
from shared.plumbing.migrate import SCHEMA_DIR
from shared.settings.common import DatabaseSettings

READS = [
    "gpu_metrics", "gpu_latest", "gpu_events", "gpu_assets", "gpu_metrics_1min", "v_gpu_metrics_1min",
    "gpu_health", "gpu_health_current", "gpu_status", "gpu_alerts", "gpu_failure_predictions",
    "v_latest_gpu_metrics", "v_fleet_health_summary", "gpu_usage_1min", "gpu_work_1min",
    "lifecycle_decisions", "lifecycle_runs", "lifecycle_inventory", "lifecycle_inventory_problems",
]  # fmt: skip

# Every one is a write, or a way around the API key, that the reader once had or might try.
FORBIDDEN = [
    "SELECT lo_from_bytea(0, 'x')",
    "SELECT lo_create(0)",
    "SELECT lo_creat(-1)",
    "SELECT lo_import('/etc/hostname')",
    "SELECT lo_put(1, 0, 'x')",
    "SELECT lo_unlink(1)",
    "CREATE TEMP TABLE scratch (x int)",
    "CREATE TEMP VIEW scratch AS SELECT 1",
    "CREATE TABLE scratch (x int)",
    "CREATE TABLE public.scratch (x int)",
    "CREATE SCHEMA scratch",
    "CREATE FUNCTION scratch() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "SELECT * FROM acknowledge_alert(1, 'reader')",
    "SELECT nextval('gpu_alerts_id_seq')",
    "SELECT * FROM kafka_offsets",
    "SELECT * FROM schema_migrations",
    "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at)"
    " VALUES ('GPU-x', 'k', 'info', 'open', 's', now(), now())",
    "UPDATE gpu_alerts SET state = 'acknowledged'",
    "DELETE FROM gpu_metrics",
    "TRUNCATE gpu_status",
    "DROP TABLE gpu_latest",
    "CALL _timescaledb_functions.cagg_migrate_update_watermark(1)",
]

# In this test's schema and every schema that is not another project schema (other tests' run beside it).
OPEN_ROUTINES = """
    SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE has_function_privilege(current_user, p.oid, 'EXECUTE')
       AND (p.prosecdef OR (n.nspname = 'pg_catalog'
                            AND (p.proname LIKE 'lo\\_%%' OR p.proname IN ('loread', 'lowrite'))))
       AND (n.nspname = current_schema() OR NOT EXISTS (
            SELECT FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'schema_migrations'))
"""  # fmt: skip


def open_alert(owner: DatabaseSettings) -> int:
    with connect(owner) as conn:
        now = datetime.now(UTC)
        row = conn.execute(
            "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, opened_at, updated_at)"
            " VALUES ('GPU-11111111-2222-3333-4444-555555555555', 'thermal', 'warning', 'open', 'hot',"
            " %s, %s)"
            " RETURNING id",
            (now, now),
        ).fetchone()
        conn.commit()
    assert row is not None
    return int(str(row[0]))


def test_the_reader_reads_every_table_and_view_the_api_and_dashboards_show(
    migrated: DatabaseSettings,
) -> None:
    with connect(reader_settings(migrated, ApiSection())) as conn:
        for name in READS:
            assert conn.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,), name


@pytest.mark.parametrize("statement", FORBIDDEN)
def test_the_reader_is_refused(migrated: DatabaseSettings, statement: str) -> None:
    with (
        connect(reader_settings(migrated, ApiSection())) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(statement)


@pytest.mark.parametrize("login", [reader_settings, acknowledger_settings])
def test_no_security_definer_routine_nor_large_object_function_is_open_to_the_api(
    migrated: DatabaseSettings, login: object
) -> None:
    settings = login(migrated, ApiSection())  # type: ignore[operator]
    with connect(settings) as conn:
        reachable = [str(r[0]) for r in conn.execute(OPEN_ROUTINES).fetchall()]
    # the key-holder's writes: acknowledging (0006), operating the remediator (0030), marking a GPU
    # repaired (0031), recording a reset or reboot done by hand (0080)
    operator = [
        "acknowledge_alert(bigint,text)", "mark_gpu_repaired(text,text,text,text)",
        "record_gpu_remedy(text,text,text,text)", "remediation_approve(bigint,text)",
        "remediation_pause(text)", "remediation_reset_breaker(text)", "remediation_resume(text)",
    ]  # fmt: skip
    assert sorted(reachable) == (operator if login is acknowledger_settings else [])


def test_only_the_acknowledger_acknowledges_and_it_can_do_nothing_else(migrated: DatabaseSettings) -> None:
    alert = open_alert(migrated)
    with (
        connect(reader_settings(migrated, ApiSection())) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM acknowledge_alert(%s, 'reader')", (alert,))
    with connect(acknowledger_settings(migrated, ApiSection())) as conn:
        row = conn.execute(
            "SELECT state, acknowledged_by FROM acknowledge_alert(%s, 'oncall')", (alert,)
        ).fetchone()
        conn.commit()
        assert row == ("acknowledged", "oncall")
        for statement in (
            "SELECT * FROM gpu_alerts",
            "CREATE TEMP TABLE scratch (x int)",
            "SELECT lo_from_bytea(0, 'x')",
            "UPDATE gpu_alerts SET state = 'open'",
            # the remediator's controls only through their functions, each recorded (schema/0030)
            "UPDATE remediation_control SET paused = false, breaker = 'closed'",
            "UPDATE remediations SET state = 'running', held_for = NULL",
            "SELECT remediation_control_event('resumed', 'nobody', NULL, 'unrecorded')",
            "DELETE FROM remediation_events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()


@pytest.mark.parametrize("login", [reader_settings, acknowledger_settings])
@pytest.mark.parametrize("database", ["postgres", "template1"])
def test_the_api_logins_cannot_enter_the_clusters_other_databases(
    migrated: DatabaseSettings, login: object, database: str
) -> None:
    """There, large objects and temporary tables would still be open to them."""
    settings = login(migrated, ApiSection())  # type: ignore[operator]
    with pytest.raises(psycopg.OperationalError, match="CONNECT privilege"):
        psycopg.connect(
            settings.model_copy(update={"name": database, "search_path": None}).conninfo()
        ).close()


def test_the_migration_can_run_again_in_the_same_schema(migrated: DatabaseSettings) -> None:
    """Roles are cluster-wide and already exist: the file must not trip over them."""
    (path,) = SCHEMA_DIR.glob("0012_*.sql")
    with connect(migrated) as conn:
        conn.execute(path.read_text())
        conn.commit()
    with (
        connect(reader_settings(migrated, ApiSection())) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM acknowledge_alert(1, 'reader')")

"""Each writing service's own database login (migration 0084), tried as the service and as an attacker
holding its password.

Table-driven over the logins: what each may write is compared with the whole schema's grants, so a
grant that widens or one that is lost fails here; each does statements of its job and is refused
(InsufficientPrivilege) a sample of what is another's. The remediator reads its controls and reaches
them only through its two functions: it holds its mode's row and trips the breaker, and may not pause,
resume, reset, approve or write the row. The logins are the bootstrap's (scripts/services.sh): their
passwords come from GPUHEALTH_DB_<SERVICE>_PASSWORD as there.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from pydantic import SecretStr

from services.api.app import acknowledger_settings
from services.api.settings import ApiSection
from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError
from shared.plumbing.migrate import SCHEMA_DIR, check_migrated
from shared.plumbing.service import named_on_the_database
from shared.settings.common import DatabaseSettings, Settings
from shared.store import archive, retention

SERVICES = ("sink", "scorer", "remediator", "lifecycle")

# What each login may do beyond SELECT, table by table: exactly this, in every table of the schema.
WRITES: dict[str, dict[str, set[str]]] = {
    "sink": {
        **{t: {"INSERT", "UPDATE"} for t in (
            "gpu_metrics", "gpu_latest", "gpu_assets", "gpu_events", "kafka_offsets", "gpu_verifications",
            "gpu_systems", "gpu_systems_latest", "gpu_processes", "gpu_process_polls", "gpu_process_latest",
            "gpu_usage_1min", "gpu_work_1min", "llm_server_status", "llm_sessions")},
        **{t: {"INSERT", "UPDATE", "DELETE"} for t in (
            "gpu_metrics_1min", "gpu_metrics_1min_pending", "sink_dead_letters")},
    },
    "scorer": {t: {"INSERT", "UPDATE"} for t in (
        "gpu_health", "gpu_health_current", "gpu_status", "gpu_failure_predictions", "gpu_alerts",
        "gpu_events")},
    "remediator": {
        **{t: {"INSERT", "UPDATE"} for t in ("remediation_decisions", "remediation_events")},
        "remediation_ownership": {"INSERT", "UPDATE", "DELETE"},
        "remediation_breaker_admissions": {"INSERT"},
        "gpu_remedies": {"INSERT"},
    },
    "lifecycle": {t: {"INSERT", "UPDATE", "DELETE"} for t in (
        "lifecycle_runs", "lifecycle_decisions", "lifecycle_inventory", "lifecycle_inventory_problems")},
}  # fmt: skip
# Column by column where a login may write some columns only: the remediator never who approved a plan.
COLUMN_WRITES: dict[str, dict[str, set[str]]] = {
    "remediator": {"remediations": {"approved_by", "approved_at"}},  # the columns it may NOT write
}
# The SECURITY DEFINER routines each may run: the remediator's two, nothing for the others.
ROUTINES = {
    "sink": {
        "sink_drop_chunks(regclass,timestamp with time zone,timestamp with time zone)",
        "sink_remove_retention_policy(regclass)",
    },
    "scorer": set(),
    "remediator": {
        "remediation_control_held(boolean)",
        "remediation_trip_breaker(boolean,text,timestamp with time zone)",
    },
    "lifecycle": set(),
}  # fmt: skip

# Statements of each one's job (a write that matches no row still needs its privilege).
ALLOWED = {
    "sink": [
        "INSERT INTO gpu_metrics SELECT * FROM gpu_metrics WHERE false",
        "UPDATE gpu_latest SET time = time WHERE false",
        "INSERT INTO gpu_events SELECT * FROM gpu_events WHERE false",
        "INSERT INTO kafka_offsets SELECT * FROM kafka_offsets WHERE false",
        "DELETE FROM gpu_metrics_1min_pending WHERE false",
        "INSERT INTO sink_dead_letters SELECT * FROM sink_dead_letters WHERE false",
        "CREATE TEMP TABLE staged (x int)",
        "SELECT count(*) FROM gpu_assets",
    ],
    "scorer": [
        "INSERT INTO gpu_health SELECT * FROM gpu_health WHERE false",
        "INSERT INTO gpu_status SELECT * FROM gpu_status WHERE false",
        "UPDATE gpu_alerts SET state = state WHERE false",
        "SELECT nextval('gpu_alerts_id_seq')",
        "SELECT count(*) FROM gpu_metrics",
        "SELECT count(*) FROM gpu_remedies",
    ],
    "remediator": [
        "SELECT * FROM remediation_control",
        "SELECT * FROM remediation_control_held(false)",
        "SELECT nextval('remediations_id_seq')",
        "INSERT INTO remediation_events SELECT * FROM remediation_events WHERE false",
        "UPDATE remediations SET state = state, step = step, detail = detail WHERE false",
        "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, dry_run, decision_key,"
        " created_at, updated_at, next_at) SELECT node, gpu_uuids, action, finding, steps, state, dry_run,"
        " decision_key, created_at, updated_at, next_at FROM remediations WHERE false",
        "DELETE FROM remediation_ownership WHERE false",
        "INSERT INTO gpu_remedies SELECT * FROM gpu_remedies WHERE false",
        "SELECT count(*) FROM gpu_status",
    ],
    "lifecycle": [
        "INSERT INTO lifecycle_runs SELECT * FROM lifecycle_runs WHERE false",
        "DELETE FROM lifecycle_inventory WHERE false",
        "SELECT count(*) FROM remediations",
        "SELECT count(*) FROM gpu_failure_predictions",
    ],
}
_EVERYONE_REFUSED = [
    "SELECT * FROM schema_migrations",
    "CREATE TABLE scratch (x int)",
    "CREATE FUNCTION scratch() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "SELECT lo_from_bytea(0, 'x')",
    "UPDATE remediation_control SET paused = false, breaker = 'closed'",
    "DELETE FROM remediation_control",
    "SELECT * FROM remediation_reset_breaker('nobody')",
    "SELECT * FROM remediation_resume('nobody')",
    "SELECT * FROM remediation_approve(1, 'nobody')",
    "SELECT remediation_control_event('resumed', 'nobody', NULL, 'unrecorded')",
    "SELECT * FROM acknowledge_alert(1, 'nobody')",
    "TRUNCATE gpu_metrics",
    "DROP TABLE gpu_latest",
]
REFUSED = {
    "sink": [
        *_EVERYONE_REFUSED,
        "INSERT INTO remediations SELECT * FROM remediations WHERE false",
        "UPDATE remediation_events SET published = true",
        "INSERT INTO gpu_health SELECT * FROM gpu_health WHERE false",
        "UPDATE gpu_status SET state = 'healthy'",
        "INSERT INTO gpu_remedies SELECT * FROM gpu_remedies WHERE false",
        "DELETE FROM gpu_metrics",
        "SELECT * FROM remediation_trip_breaker(false, 'sink', now())",
    ],
    "scorer": [
        *_EVERYONE_REFUSED,
        "INSERT INTO remediations SELECT * FROM remediations WHERE false",
        "INSERT INTO remediation_decisions SELECT * FROM remediation_decisions WHERE false",
        "UPDATE remediations SET state = 'running', held_for = NULL",
        "INSERT INTO gpu_metrics SELECT * FROM gpu_metrics WHERE false",
        "INSERT INTO gpu_remedies SELECT * FROM gpu_remedies WHERE false",
        "DELETE FROM gpu_alerts",
        "SELECT * FROM kafka_offsets",
        "SELECT * FROM remediation_trip_breaker(false, 'scorer', now())",
        "CREATE TEMP TABLE staged (x int)",
    ],
    "remediator": [
        *_EVERYONE_REFUSED,
        "SELECT * FROM remediation_control FOR UPDATE",
        "UPDATE remediations SET approved_by = 'remediator', approved_at = now()",
        "INSERT INTO remediations SELECT * FROM remediations WHERE false",
        "INSERT INTO remediation_control (dry_run) VALUES (NULL)",
        "SELECT * FROM remediation_pause('remediator')",
        "INSERT INTO gpu_health SELECT * FROM gpu_health WHERE false",
        "UPDATE gpu_status SET state = 'healthy'",
        "INSERT INTO gpu_alerts SELECT * FROM gpu_alerts WHERE false",
        "DELETE FROM remediation_events",
        "DELETE FROM remediations",
        "UPDATE gpu_remedies SET at = now()",
        "INSERT INTO gpu_metrics SELECT * FROM gpu_metrics WHERE false",
        "CREATE TEMP TABLE staged (x int)",
    ],
    "lifecycle": [
        *_EVERYONE_REFUSED,
        "INSERT INTO remediations SELECT * FROM remediations WHERE false",
        "INSERT INTO gpu_health SELECT * FROM gpu_health WHERE false",
        "UPDATE gpu_status SET state = 'healthy'",
        "INSERT INTO gpu_assets SELECT * FROM gpu_assets WHERE false",
        "SELECT * FROM remediation_trip_breaker(false, 'lifecycle', now())",
        "CREATE TEMP TABLE staged (x int)",
    ],
}

PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
OWN_TABLES = """
    SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace
       AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 1
"""
OWN_ROUTINES = """
    SELECT p.oid::regprocedure::text FROM pg_proc p
     WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef
       AND has_function_privilege(%s, p.oid, 'EXECUTE')
"""

# Each column of the tables a login may not INSERT into nor UPDATE as a whole: whether it may write it.
COLUMNS = """
    SELECT c.relname, a.attname, has_column_privilege(%(r)s, c.oid, a.attnum, 'INSERT')
                                 OR has_column_privilege(%(r)s, c.oid, a.attnum, 'UPDATE')
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
       AND NOT has_table_privilege(%(r)s, c.oid, 'INSERT') AND NOT has_table_privilege(%(r)s, c.oid, 'UPDATE')
"""


def as_service(migrated: DatabaseSettings, service: str) -> DatabaseSettings:
    """The owner's address and schema with the service's login, named as the service names itself."""
    password = os.environ.get(f"GPUHEALTH_DB_{service.upper()}_PASSWORD", f"gpuhealth_{service}")
    db = migrated.model_copy(update={"user": f"gpuhealth_{service}", "password": SecretStr(password)})
    return named_on_the_database(Settings(db=db), service).db


@pytest.mark.parametrize("service", SERVICES)
def test_each_login_writes_exactly_its_own_tables_and_reads_no_bookkeeping(
    migrated: DatabaseSettings, service: str
) -> None:
    role = f"gpuhealth_{service}"
    with connect(migrated) as conn:
        tables = [str(r[0]) for r in conn.execute(OWN_TABLES).fetchall()]
        granted = {
            table: {p for p in PRIVILEGES if conn.execute(
                "SELECT has_table_privilege(%s, format('%%I', %s::text), %s)", (role, table, p)
            ).fetchone() == (True,)}
            for table in tables
        }  # fmt: skip
        unreadable = {
            table for table in tables
            if conn.execute("SELECT has_table_privilege(%s, format('%%I', %s::text), 'SELECT')",
                            (role, table)).fetchone() == (False,)
        }  # fmt: skip
        routines = {str(r[0]).replace(", ", ",") for r in conn.execute(OWN_ROUTINES, (role,)).fetchall()}
        columns = conn.execute(COLUMNS, {"r": role}).fetchall()
    some_columns = {str(t) for t, _, writable in columns if writable}
    not_written = {t: {str(c) for t2, c, w in columns if t2 == t and not w} for t in some_columns}
    assert {t: p for t, p in granted.items() if p} == WRITES[service]
    assert not_written == COLUMN_WRITES.get(service, {})
    assert unreadable == (
        {"schema_migrations"} if service == "sink" else {"schema_migrations", "kafka_offsets"}
    )
    assert routines == ROUTINES[service]


@pytest.mark.parametrize("service", SERVICES)
def test_each_login_does_its_job_and_is_refused_what_is_not_its_own(
    migrated: DatabaseSettings, service: str
) -> None:
    """One schema for all of a login's statements (each in its own transaction): a list of what failed."""
    failed, not_refused = [], []
    with connect(as_service(migrated, service)) as conn:
        for statement in ALLOWED[service]:
            try:
                conn.execute(statement)
            except psycopg.Error as e:
                failed.append(f"{statement}: {e}")
            conn.rollback()
        for statement in REFUSED[service]:
            try:
                conn.execute(statement)
                not_refused.append(statement)
            except psycopg.errors.InsufficientPrivilege:
                pass
            except psycopg.Error as e:
                not_refused.append(f"{statement}: {type(e).__name__} {e}")
            conn.rollback()
    assert failed == []
    assert not_refused == []


def test_the_remediator_trips_its_breaker_through_its_function_and_can_do_nothing_else_to_it(
    migrated: DatabaseSettings,
) -> None:
    with connect(as_service(migrated, "remediator")) as conn:
        held = conn.execute("SELECT breaker FROM remediation_control_held(true)").fetchall()
        tripped = conn.execute(
            "SELECT breaker, trip_reason FROM remediation_trip_breaker(true, 'too many nodes', now())"
        ).fetchall()
        conn.commit()
        assert held == [("closed",)]
        assert tripped == [("open", "too many nodes")]
        # closing it again is an operator's (remediation_reset_breaker, through the API)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE remediation_control SET breaker = 'closed' WHERE dry_run")
    with connect(migrated) as conn:
        rows = conn.execute(
            "SELECT dry_run, breaker, paused FROM remediation_control ORDER BY dry_run"
        ).fetchall()
    assert rows == [(False, "closed", False), (True, "open", False)]


def test_a_plan_the_breaker_held_is_released_by_a_person_only(migrated: DatabaseSettings) -> None:
    """The remediator may withdraw a plan the breaker held, never set it running nor move it to a hold it
    lifts itself; the operator's remediation_approve (the API's acknowledger) does. A plan held for
    approval it may start by its policy (decide.start_held), without writing who approved it."""
    with connect(migrated) as conn:
        for node, held_for in (("node-a", "approval"), ("node-b", "breaker"), ("node-c", "breaker")):
            conn.execute(
                "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, held_for, dry_run,"
                " decision_key, created_at, updated_at, next_at)"
                " VALUES (%s, ARRAY['GPU-1'], 'reset_gpu', 'xid', ARRAY['cordon'], 'held', %s, false, %s,"
                " now(), now(), now())",
                (node, held_for, node),
            )
        conn.commit()
    with connect(as_service(migrated, "remediator")) as conn:
        for statement in (
            "UPDATE remediations SET state = 'running', held_for = NULL WHERE node = 'node-b'",
            "UPDATE remediations SET held_for = 'rate_limit' WHERE node = 'node-b'",
            "UPDATE remediations SET approved_by = 'remediator' WHERE node = 'node-a'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()
        conn.execute("UPDATE remediations SET state = 'withdrawn' WHERE node = 'node-c'")
        conn.execute("UPDATE remediations SET detail = '{\"seen\": 1}' WHERE node = 'node-b'")
        conn.execute("UPDATE remediations SET state = 'running', held_for = NULL WHERE node = 'node-a'")
        conn.commit()
    with connect(migrated) as conn:
        plan = conn.execute("SELECT id FROM remediations WHERE node = 'node-b'").fetchone()
    with connect(acknowledger_settings(migrated, ApiSection())) as conn:
        approved = conn.execute(
            "SELECT state, approved_by FROM remediation_approve(%s, 'oncall')", plan
        ).fetchall()
        conn.commit()
    assert approved == [("running", "oncall")]


def test_the_sinks_retention_drops_expired_chunks_as_its_own_login_and_only_those_it_keeps(
    migrated: DatabaseSettings,
) -> None:
    """drop_chunks is the hypertable owner's alone: the sink does it through schema/0086's functions."""
    old = datetime.now(UTC) - timedelta(days=400)
    with connect(migrated) as conn:
        conn.execute(
            "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, source, collector_id)"
            " VALUES (%s, 'GPU-old', 'node-old', 'mock', 'test')",
            (old,),
        )
        conn.commit()
    with connect(as_service(migrated, "sink"), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT public.drop_chunks('gpu_metrics'::regclass, older_than => now())")
        with pytest.raises(DatabaseError, match="not a table whose chunks the sink keeps"):
            retention.drop_chunks_older_than(conn, "gpu_health", datetime.now(UTC))
        with pytest.raises(DatabaseError, match="not a table whose chunks the sink keeps"):
            retention.remove_retention_policy(conn, "gpu_status")
        # The archive's way: the chunk held in SHARE mode, its rows read, then exactly it dropped.
        (chunk,) = archive.expired_chunks(conn, "gpu_metrics", old + timedelta(days=30))
        assert retention.range_holds_only(conn, chunk)
        with retention.share_locked(conn, chunk):
            assert archive.count_rows(conn, chunk) == 1
            assert retention.drop_chunk_range(conn, chunk) == 1
        assert conn.execute("SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-old'").fetchone() == (0,)
        assert retention.drop_chunks_older_than(conn, "gpu_metrics", old + timedelta(days=30)) == 0
        assert retention.drop_chunks_older_than(conn, "gpu_events", old) == 0


@pytest.mark.parametrize("service", SERVICES)
def test_each_login_passes_its_services_start_check(migrated: DatabaseSettings, service: str) -> None:
    """What each service does first (shared.plumbing.migrate.check_migrated): read the migrations applied.
    `make up` failed here when the logins could not read schema_migrations at all."""
    with connect(as_service(migrated, service)) as conn:
        check_migrated(conn)
        assert {int(str(v)) for (v,) in conn.execute("SELECT version FROM schema_migrations")} >= {84, 85}


@pytest.mark.parametrize("service", SERVICES)
def test_each_login_names_its_service_in_pg_stat_activity(migrated: DatabaseSettings, service: str) -> None:
    with connect(as_service(migrated, service)) as conn:
        row = conn.execute(
            "SELECT usename, application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
    assert row == (f"gpuhealth_{service}", f"gpu-health-{service}")


def test_the_migration_can_run_again_in_the_same_schema(migrated: DatabaseSettings) -> None:
    """Roles are cluster-wide and already exist (made by the bootstrap with their logins): the file must
    not trip over them, nor take their logins away."""
    (path,) = SCHEMA_DIR.glob("0084_*.sql")
    text = path.read_text()
    grants_only = text[: text.index("CREATE FUNCTION remediation_hold_kept")]
    with connect(migrated) as conn:
        conn.execute(grants_only)
        conn.commit()
    with connect(as_service(migrated, "scorer")) as conn:
        conn.execute("INSERT INTO gpu_health SELECT * FROM gpu_health WHERE false")

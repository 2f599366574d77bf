"""The schema on the real TimescaleDB: tables match the contract, views and retention work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from prometheus_client import CollectorRegistry

from services.sink.metrics import SinkMetrics
from services.sink.retention import Retention
from services.sink.rows import METRIC_COLUMNS, STAGE_TYPES
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings


def columns(conn: psycopg.Connection[tuple[object, ...]], table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    return {str(n): str(t) for n, t in rows}


def test_gpu_metrics_has_every_contract_field_with_its_type(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        cols = columns(conn, "gpu_metrics")
        assert set(cols) == set(METRIC_COLUMNS)
        for name, pg_type in zip(METRIC_COLUMNS, STAGE_TYPES, strict=False):
            expected = {"timestamptz": "timestamp with time zone"}.get(pg_type, pg_type)
            assert cols[name] == expected, name
        hypertables = {
            str(r[0])
            for r in conn.execute(
                "SELECT hypertable_name FROM timescaledb_information.hypertables"
                " WHERE hypertable_schema = current_schema()"
            ).fetchall()
        }
        workload = {"gpu_processes", "gpu_process_polls", "llm_sessions", "llm_server_status"}  # 0013
        assert hypertables == {
            "gpu_metrics",
            "gpu_events",
            "gpu_metrics_1min",
            "gpu_verifications",
            *workload,
            "remediation_events",  # 0030: the remediator's record
            "gpu_usage_1min",  # 0050
            "gpu_work_1min",
            "lifecycle_decisions",  # 0060: every GPU's lifecycle decision over time
        }


def test_retention_drops_only_old_chunks(migrated: DatabaseSettings) -> None:
    old, recent = datetime.now(UTC) - timedelta(days=40), datetime.now(UTC) - timedelta(hours=1)
    with connect(migrated) as conn:
        for t in (old, recent):
            conn.execute(
                "INSERT INTO gpu_metrics (time, gpu_uuid, hostname, source, collector_id)"
                " VALUES (%s, 'GPU-00000000-aaaa', 'n', 'mock', 'c')",
                (t,),
            )
        conn.commit()
    dropped = Retention(migrated, SinkMetrics(CollectorRegistry()), keep_raw_days=30).run_once()
    assert dropped["gpu_metrics"] == 1
    with connect(migrated) as conn:
        left = conn.execute("SELECT time FROM gpu_metrics").fetchall()
    assert [r[0] for r in left] == [recent]


def test_retention_forgets_dead_letters_delivered_long_ago(migrated: DatabaseSettings) -> None:
    with connect(migrated) as conn:
        for offset, delivered in ((0, timedelta(days=200)), (1, timedelta(days=1)), (2, None)):
            conn.execute(
                "INSERT INTO sink_dead_letters (consumer_group, source_topic, source_partition,"
                " source_offset, category, reason, delivered_at)"
                " VALUES ('g', 't', 0, %s, 'contract', 'r', %s)",
                (offset, datetime.now(UTC) - delivered if delivered else None),
            )
        conn.commit()
    Retention(migrated, SinkMetrics(CollectorRegistry()), keep_events_days=180).run_once()
    with connect(migrated) as conn:
        left = conn.execute("SELECT source_offset FROM sink_dead_letters ORDER BY 1").fetchall()
    assert [r[0] for r in left] == [1, 2]  # the recent one, and the one not yet delivered

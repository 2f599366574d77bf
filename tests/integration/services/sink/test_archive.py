"""The Parquet archive on the real TimescaleDB: rows before = rows archived + rows left, nothing lost."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from services.sink.metrics import SinkMetrics
from services.sink.retention import Retention
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.archive import KEYS, TABLES, archived_rows, check_manifests, fill, snapshot
from tests.helpers.sink import counter_value
from tests.paths import REPO


def test_archive_then_drop_keeps_every_row(migrated: DatabaseSettings, tmp_path: Path) -> None:
    fill(migrated)
    before = {table: snapshot(migrated, table) for table in TABLES}
    metrics = SinkMetrics(CollectorRegistry())
    retention = Retention(migrated, metrics, archive_dir=tmp_path, archive_block_kib=1024)

    dropped = retention.run_once()

    assert all(dropped[t] >= 2 for t in TABLES), dropped
    for table in TABLES:
        after = snapshot(migrated, table)
        archived = archived_rows(tmp_path, table)
        keys = [tuple(row[k] for k in KEYS[table]) for row in archived]
        assert len(keys) == len(set(keys)), "a row archived twice"
        assert not set(keys) & set(after), "a row both archived and still in the database"
        assert len(before[table]) == len(archived) + len(after)
        assert set(keys) | set(after) == set(before[table])
        for row in archived:  # every column, including NULLs, JSON and hostile text
            assert row == before[table][tuple(row[k] for k in KEYS[table])]
        assert counter_value(metrics.archived_rows, table=table) == len(archived)
        assert counter_value(metrics.chunks_dropped, table=table) == dropped[table]
    files = check_manifests(tmp_path)
    assert files >= sum(dropped.values())
    assert counter_value(metrics.archived_files) == files
    assert counter_value(metrics.archived_bytes) == sum(p.stat().st_size for p in tmp_path.rglob("*.parquet"))
    assert metrics.retention_last_success._value.get() > 0
    # 7-day event chunks span days: one file per day, each under its own day= folder
    assert len({p.parent for p in (tmp_path / "table=gpu_events").rglob("*.parquet")}) > dropped["gpu_events"]
    footer = pq.ParquetFile(next(tmp_path.rglob("*.parquet"))).metadata
    assert footer.row_group(0).column(0).compression == "ZSTD"

    # A second round finds nothing to do and writes nothing.
    names = sorted(tmp_path.rglob("*"))
    assert retention.run_once() == dict.fromkeys(TABLES, 0)
    assert sorted(tmp_path.rglob("*")) == names


def test_a_chunk_that_fails_to_archive_is_not_dropped(migrated: DatabaseSettings, tmp_path: Path) -> None:
    fill(migrated, days=1)
    before = snapshot(migrated, "gpu_metrics")
    blocker = tmp_path / "table=gpu_metrics"
    blocker.write_text("a file where the table's folder should be")
    metrics = SinkMetrics(CollectorRegistry())
    retention = Retention(migrated, metrics, archive_dir=tmp_path)

    retention.run_round()  # logs and counts the failure, raises nothing

    assert counter_value(metrics.retention_failures) == 1
    assert snapshot(migrated, "gpu_metrics") == before
    blocker.unlink()
    retention.run_round()
    assert len(archived_rows(tmp_path, "gpu_metrics")) + len(snapshot(migrated, "gpu_metrics")) == len(before)


def test_without_an_archive_dir_retention_only_drops(migrated: DatabaseSettings) -> None:
    fill(migrated, days=1)
    dropped = Retention(migrated, SinkMetrics(CollectorRegistry())).run_once()
    assert dropped["gpu_metrics"] >= 4
    with connect(migrated) as conn:
        left = conn.execute(
            "SELECT count(*) FROM gpu_metrics WHERE time < now() - interval '30 days'"
        ).fetchone()
    assert left == (0,)


def documented_archive_query() -> str:
    text = (REPO / "docs" / "operating.md").read_text()
    block = text.split("<!-- archive-query -->", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return block.strip().replace("~/.cache/gpu-health/venv/bin/python", sys.executable)


def query_env(db: DatabaseSettings, archive: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "OTEL_"))}
    return {**clean, "GPUHEALTH_DB__HOST": db.host, "GPUHEALTH_DB__PORT": str(db.port),
            "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
            "GPUHEALTH_SINK__ARCHIVE_DIR": str(archive)}  # fmt: skip


def test_the_documented_one_liner_queries_archive_and_database_together(
    migrated: DatabaseSettings, tmp_path: Path
) -> None:
    fill(migrated, days=2)
    with connect(migrated) as conn:
        want = {
            str(day): int(str(n))
            for day, n in conn.execute(
                "SELECT (time AT TIME ZONE 'UTC')::date, count(*) FROM gpu_metrics GROUP BY 1"
            ).fetchall()
        }
    Retention(migrated, SinkMetrics(CollectorRegistry()), archive_dir=tmp_path).run_once()
    assert archived_rows(tmp_path, "gpu_metrics"), "the query must span both sides"
    query = documented_archive_query()
    done = subprocess.run(["bash", "-c", query], cwd=REPO, env=query_env(migrated, tmp_path),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = {m[0]: int(m[1]) for m in re.findall(r"(\d{4}-\d\d-\d\d)\s*│\s*(\d+)\s*│", done.stdout)}
    assert got == want


def test_the_query_tool_counts_every_table_exactly_once(migrated: DatabaseSettings, tmp_path: Path) -> None:
    fill(migrated, days=1)
    before = {table: len(snapshot(migrated, table)) for table in TABLES}
    Retention(migrated, SinkMetrics(CollectorRegistry()), archive_dir=tmp_path).run_once()
    union = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t}" for t in TABLES)
    done = subprocess.run(
        [sys.executable, "-m", "services.sink.archive_query", "--format", "csv", union],
        cwd=REPO, env={**query_env(migrated, tmp_path), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = {row["t"]: int(row["n"]) for row in csv.DictReader(io.StringIO(done.stdout))}
    assert got == before


def test_the_background_round_stops_between_chunks_and_loses_nothing(
    migrated: DatabaseSettings, tmp_path: Path
) -> None:
    fill(migrated, days=2)
    before = {table: snapshot(migrated, table) for table in TABLES}
    metrics = SinkMetrics(CollectorRegistry())
    retention = Retention(migrated, metrics, archive_dir=tmp_path, interval_s=3600)
    retention()  # starts the round in its own thread and returns at once
    retention()  # a round is running (or just ran): no second one within the interval
    first = retention._thread
    retention.close()  # SIGTERM: the chunk in hand goes back to the database
    assert first is not None
    assert not first.is_alive()
    assert retention._thread is first
    for table in TABLES:
        archived = archived_rows(tmp_path, table)
        keys = {tuple(row[k] for k in KEYS[table]) for row in archived}
        after = snapshot(migrated, table)
        assert len(keys) == len(archived)
        assert keys | set(after) == set(before[table])
    check_manifests(tmp_path)  # whatever was published is whole
    assert counter_value(metrics.retention_failures) == 0

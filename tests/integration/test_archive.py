"""The Parquet archive on the real TimescaleDB: rows before = rows archived + rows left, nothing lost."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from services.sink.maintenance import Retention
from services.sink.metrics import SinkMetrics
from shared.config import DatabaseSettings
from shared.db import connect

from .archive_helpers import KEYS, TABLES, archived_rows, check_manifests, fill, snapshot
from .sink_helpers import counter_value


def test_archive_then_drop_keeps_every_row(migrated: DatabaseSettings, tmp_path: Path) -> None:
    fill(migrated)
    before = {table: snapshot(migrated, table) for table in TABLES}
    metrics = SinkMetrics(CollectorRegistry())
    retention = Retention(migrated, metrics, archive_dir=tmp_path, archive_batch_rows=1000)

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

"""DuckDB over the Parquet archive and the database: per retained table, archived rows UNION ALL live ones.

The archived rows are read in place from the Parquet files under the archive
directory, the live ones fetched from TimescaleDB (shared/store/archive.py);
`since` bounds both sides by time. A row is in exactly one of the two
(retention archives a chunk and drops it in one transaction), so counts and
sums over the views are exact. Driver failures leave as
`shared.plumbing.errors.DatabaseError`; DuckDB's own errors as `duckdb.Error`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb

from .archive import Conn, live_rows

TABLES = ("gpu_metrics", "gpu_events", "gpu_metrics_1min")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def open_views(db: Conn, archive_dir: Path | None, since: datetime | None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where each retained table is a view over archive + database."""
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    for table in TABLES:
        live, time_column = live_rows(db, table, since)
        duck.register(f"_live_{table}", live)
        files = sorted((archive_dir / f"table={table}").rglob("*.parquet")) if archive_dir else []
        if not files:
            duck.execute(f"CREATE VIEW {table} AS SELECT * FROM _live_{table}")
            continue
        where = f" WHERE {time_column} >= {_literal(since.isoformat())}::TIMESTAMPTZ" if since else ""
        paths = ", ".join(_literal(str(f)) for f in files)
        duck.execute(
            f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{paths}], hive_partitioning = false,"
            f" union_by_name = true){where} UNION ALL BY NAME SELECT * FROM _live_{table}"
        )
    return duck

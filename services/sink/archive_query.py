"""`python -m services.sink.archive_query "SQL"`: one SQL query over the Parquet archive and the database.

In the query, ``gpu_metrics``, ``gpu_events`` and ``gpu_metrics_1min`` are
DuckDB views: the archived rows (read in place from the Parquet files under
GPUHEALTH_SINK__ARCHIVE_DIR, or ``--archive-dir``) UNION ALL the rows still
in TimescaleDB (fetched with the usual GPUHEALTH_DB__* settings). ``--since``
bounds both sides by time, so a question about last quarter does not pull the
whole database. A row is in exactly one of the two (retention archives a chunk
and drops it in one transaction), so counts and sums over the views are exact.
``--format csv`` prints CSV instead of a table.

    python -m services.sink.archive_query --since 2026-08-01 \\
      "SELECT time::date AS day, count(*) AS samples FROM gpu_metrics GROUP BY day ORDER BY day"
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
from psycopg import sql

from shared.config import load_settings
from shared.db import connect
from shared.errors import GpuHealthError

from .__main__ import SinkSettings
from .archive import Conn, columns_of
from .chunk_reader import arrow_schema, copy_batches

TABLES = ("gpu_metrics", "gpu_events", "gpu_metrics_1min")


def live_rows(conn: Conn, table: str, since: datetime | None) -> tuple[pa.Table, str]:
    """The table's rows in the database (from `since`), typed as the archive types them; its time column."""
    columns = columns_of(conn, table)
    time_row = conn.execute(
        "SELECT d.column_name FROM timescaledb_information.dimensions d"
        " JOIN pg_class c ON c.relname = d.hypertable_name"
        " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = d.hypertable_schema"
        " WHERE c.oid = %s::regclass AND d.dimension_number = 1",
        (table,),
    ).fetchone()
    time_column = str(time_row[0]) if time_row else "time"
    schema = arrow_schema(columns)
    where = sql.SQL("{} >= %s").format(sql.Identifier(time_column)) if since else None
    batches = list(
        copy_batches(
            conn, sql.Identifier(table), columns, schema, where=where, params=(since,) if since else ()
        )
    )
    return (pa.concat_tables(batches) if batches else schema.empty_table()), time_column


def utc_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.sink.archive_query", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("sql", help="a DuckDB query over gpu_metrics, gpu_events, gpu_metrics_1min")
    parser.add_argument("--since", type=utc_time, help="only rows from this time (ISO 8601, UTC if no zone)")
    parser.add_argument("--archive-dir", type=Path, help="default: GPUHEALTH_SINK__ARCHIVE_DIR")
    parser.add_argument("--format", choices=("table", "csv"), default="table")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(SinkSettings)
        with connect(settings.db) as conn:
            duck = open_views(conn, args.archive_dir or settings.sink.archive_dir, args.since)
        result = duck.sql(args.sql)
        if args.format == "csv":
            out = csv.writer(sys.stdout)
            out.writerow(result.columns)
            out.writerows(result.fetchall())
        else:
            result.show(max_rows=1000, max_width=200)
    except (GpuHealthError, psycopg.Error, duckdb.Error) as e:
        print(f"archive_query: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.settings.common import load_settings
from shared.store.archive_duckdb import open_views

from .__main__ import SinkSettings


def utc_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.sink.archive_query",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    except (GpuHealthError, duckdb.Error) as e:
        print(f"archive_query: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

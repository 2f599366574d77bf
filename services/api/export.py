"""Usage as a file: CSV or Parquet, row for row and number for number what the usage endpoints answer.

One row per group (`kind` = group) and one per total (`kind` = total, `key`
empty), each with the window, the dimension and, for a timeline, the period.
CSV writes floats in Python's shortest exact form (what the JSON answer
holds) and times in the answer's format; a string a spreadsheet would run as a
formula is neutralised (:func:`csv_cell`, which the lifecycle export uses too);
Parquet types every column (timestamps in UTC microseconds, float64 figures)
and is zstd-compressed, as the sink's archive writes its files.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .answers.usage import Usage, UsageFigures, UsageTimeline
from .paging import z_time

FIGURES = list(UsageFigures.model_fields)
COLUMNS = ["from", "to", "by", "period", "kind", "key", *FIGURES]
SCHEMA = pa.schema(
    [
        ("from", pa.timestamp("us", tz="UTC")),
        ("to", pa.timestamp("us", tz="UTC")),
        ("by", pa.string()),
        ("period", pa.timestamp("us", tz="UTC")),
        ("kind", pa.string()),
        ("key", pa.string()),
        ("gpus", pa.int64()),
        *((name, pa.float64()) for name in FIGURES if name != "gpus"),
    ]
)
MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet"}


def export_rows(answer: Usage | UsageTimeline) -> list[dict[str, Any]]:
    """The answer's groups and totals as flat rows (COLUMNS), in the answer's order."""
    head = {"from": answer.start, "to": answer.end, "by": answer.by}
    periods = (
        [(p.period, p.groups, p.total) for p in answer.periods]
        if isinstance(answer, UsageTimeline)
        else [(None, answer.groups, answer.total)]
    )
    rows = []
    for period, groups, total in periods:
        for g in groups:
            rows.append({**head, "period": period, "kind": "group", **g.model_dump()})
        rows.append({**head, "period": period, "kind": "total", "key": None, **total.model_dump()})
    return rows


# What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def iso_z(value: datetime) -> str:
    """A time as ISO 8601 with `Z`, no fraction when it has none (the usage export's)."""
    return value.isoformat().replace("+00:00", "Z")


def csv_cell(value: Any, time: Callable[[datetime], str] = z_time) -> str:
    """A value as a CSV cell: None empty, a time as `time` writes it (the API's format unless told),
    a float exactly; a string that would start a formula gets a leading `'` (strings only: a negative
    number stays a number)."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return time(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_START) else value
    return str(value)


def to_csv(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([csv_cell(r[c], iso_z) for c in COLUMNS] for r in rows)
    return out.getvalue().encode()


def to_parquet(rows: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    table = pa.Table.from_pylist([{c: r[c] for c in COLUMNS} for r in rows], schema=SCHEMA)
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def exported(answer: Usage | UsageTimeline, fmt: str) -> bytes:
    rows = export_rows(answer)
    return to_parquet(rows) if fmt == "parquet" else to_csv(rows)

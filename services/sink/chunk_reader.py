"""Rows of a table or chunk as Arrow record batches, fast: COPY ... TO STDOUT (CSV) parsed by Arrow's C++.

Going through Python objects row by row (a cursor, then pa.array) archived
~4,000 rows/s where this does ~29,000 (bench/bench_archive.py); here PostgreSQL writes CSV and Arrow parses
it in blocks, so Python never touches a row. What makes the round trip exact:
timestamps travel as integer microseconds since the epoch (no time zone or
DateStyle in play), NULL is an unquoted empty field while an empty string is
quoted (``""``), booleans are ``t``/``f``, floats use PostgreSQL's shortest
exact text (NaN and infinities included), and values with commas, quotes or
newlines are quoted by COPY and read back as such.
"""

from __future__ import annotations

import io
from collections.abc import Generator, Iterable, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

ARROW_TYPES: dict[str, pa.DataType] = {
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "timestamp without time zone": pa.timestamp("us"),
    "double precision": pa.float64(),
    "real": pa.float32(),
    "bigint": pa.int64(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
    "boolean": pa.bool_(),
    "text": pa.string(),
    "date": pa.date32(),
}
_EPOCH_US = sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint")


def arrow_schema(columns: list[tuple[str, str]], metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Arrow types for (column, PostgreSQL type) pairs: text for any type without its own."""
    fields = [pa.field(name, ARROW_TYPES.get(pg_type, pa.string())) for name, pg_type in columns]
    return pa.schema(fields, metadata=metadata)


class _CopyStream(io.RawIOBase):
    """COPY's blocks as a readable binary stream, for Arrow's CSV reader."""

    def __init__(self, blocks: Iterable[Any]) -> None:
        self._blocks = iter(blocks)
        self._block = memoryview(b"")

    def readable(self) -> bool:
        return True

    def has_data(self) -> bool:
        """Whether anything is left (Arrow's reader refuses an empty input rather than giving no rows)."""
        while not self._block:
            try:
                self._block = memoryview(bytes(next(self._blocks)))
            except StopIteration:
                return False
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.has_data():
            return 0
        n = min(len(buffer), len(self._block))
        buffer[:n] = self._block[:n]
        self._block = self._block[n:]
        return n


def copy_batches(
    conn: psycopg.Connection[Any],
    relation: sql.Composable,
    columns: list[tuple[str, str]],
    schema: pa.Schema,
    *,
    order_by: Sequence[str] = (),
    where: sql.Composable | None = None,
    params: tuple[Any, ...] = (),
    block_bytes: int = 8 << 20,
) -> Generator[pa.Table, None, None]:
    """The rows of `relation` (optionally filtered and ordered) as tables of `schema`, block by block."""
    selected: list[sql.Composable] = []
    wire: list[pa.Field] = []
    for (name, pg_type), target in zip(columns, schema, strict=True):
        ident = sql.Identifier(name)
        if pa.types.is_timestamp(target.type):
            selected.append(_EPOCH_US.format(ident))
            wire.append(pa.field(name, pa.int64()))
        elif pg_type in ARROW_TYPES:
            selected.append(ident)
            wire.append(target)
        else:
            selected.append(sql.SQL("{}::text").format(ident))
            wire.append(target)
    query = sql.SQL("COPY (SELECT {} FROM {}").format(sql.SQL(", ").join(selected), relation)
    if where is not None:
        query += sql.SQL(" WHERE ") + where
    if order_by:
        query += sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(sql.Identifier(c) for c in order_by))
    query += sql.SQL(") TO STDOUT (FORMAT csv)")
    with conn.cursor() as cursor, cursor.copy(query, params or None) as copy:
        stream = _CopyStream(copy)
        if not stream.has_data():
            return
        reader = pacsv.open_csv(
            io.BufferedReader(stream, buffer_size=1 << 20),
            read_options=pacsv.ReadOptions(column_names=[f.name for f in wire], block_size=block_bytes),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={f.name: f.type for f in wire},
                null_values=[""],  # only COPY's NULL: "NaN", "NULL" or "N/A" are values
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                true_values=["t"],
                false_values=["f"],
            ),
        )
        for batch in reader:
            arrays = [
                batch.column(i).cast(target.type) if pa.types.is_timestamp(target.type) else batch.column(i)
                for i, target in enumerate(schema)
            ]
            yield pa.Table.from_arrays(arrays, schema=schema)

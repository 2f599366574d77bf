"""The archive's reads: chunks past retention, their columns and rows (as Arrow), and hypertable sizes.

Rows leave as Arrow tables, fast: ``COPY (SELECT ...) TO STDOUT (FORMAT csv)``
parsed by Arrow's C++. Going through Python objects row by row (a cursor, then
pa.array) archived ~4,000 rows/s where this does ~29,000
(bench/bench_archive.py); here PostgreSQL writes CSV and Arrow parses it in
blocks, so Python never touches a row. What makes the round trip exact:
timestamps travel as integer microseconds since the epoch (no time zone or
DateStyle in play), NULL is an unquoted empty field while an empty string is
quoted (``""``), booleans are ``t``/``f``, floats use PostgreSQL's shortest
exact text (NaN and infinities included), and values with commas, quotes or
newlines are quoted by COPY and read back as such.

Functions take a sync connection. Driver failures leave as
`shared.plumbing.errors.DatabaseError` (or a subclass); Arrow's own errors (a row larger
than a block: ``pyarrow.ArrowInvalid``) leave as they are.
"""

from __future__ import annotations

import io
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from .errors import translate, translated

Conn = psycopg.Connection[tuple[Any, ...]]

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


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk past retention, as TimescaleDB describes it."""

    hypertable: str
    schema: str
    name: str
    start: datetime
    end: datetime
    time_column: str

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def relation(self, conn: Conn) -> str:
        """The chunk's quoted, schema-qualified name, as `::regclass` reads it."""
        return self.ident.as_string(conn)


def expired_chunks(conn: Conn, table: str, older_than: datetime) -> list[Chunk]:
    """The chunks drop_chunks(table, older_than) would drop, oldest first, with their ranges."""
    with translated(conn):
        rows = conn.execute(
            "SELECT c.hypertable_name, c.chunk_schema, c.chunk_name, c.range_start, c.range_end,"
            "       d.column_name"
            " FROM public.show_chunks(%s::regclass, older_than => %s) AS s(chunk)"
            " JOIN timescaledb_information.chunks c"
            "   ON format('%%I.%%I', c.chunk_schema, c.chunk_name)::regclass = s.chunk"
            " JOIN timescaledb_information.dimensions d"
            "   ON (d.hypertable_schema, d.hypertable_name) = (c.hypertable_schema, c.hypertable_name)"
            "  AND d.dimension_number = 1"
            " ORDER BY c.range_start",
            (table, older_than),
        ).fetchall()
    return [Chunk(table, str(r[1]), str(r[2]), r[3], r[4], str(r[5])) for r in rows]


def columns_of(conn: Conn, relation: str) -> list[tuple[str, str]]:
    """(column, PostgreSQL type) of a table or chunk (a name as regclass reads it), in table order."""
    with translated(conn):
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (relation,),
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def time_column_of(conn: Conn, table: str) -> str:
    """The hypertable's time dimension (``time`` for a table that is not one)."""
    with translated(conn):
        row = conn.execute(
            "SELECT d.column_name FROM timescaledb_information.dimensions d"
            " JOIN pg_class c ON c.relname = d.hypertable_name"
            " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = d.hypertable_schema"
            " WHERE c.oid = %s::regclass AND d.dimension_number = 1",
            (table,),
        ).fetchone()
    return str(row[0]) if row else "time"


def count_rows(conn: Conn, chunk: Chunk) -> int:
    """count(*) of the chunk, as the transaction sees it."""
    with translated(conn):
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(chunk.ident)).fetchone()
    return int(row[0]) if row is not None else 0


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
    conn: Conn,
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
    try:
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
                    column.cast(target.type) if pa.types.is_timestamp(target.type) else column
                    for column, target in zip(batch.columns, schema, strict=True)
                ]
                yield pa.Table.from_arrays(arrays, schema=schema)
    except psycopg.Error as e:  # only the driver's: Arrow's errors are about the rows and leave as they are
        raise translate(e, conn) from e


def chunk_batches(
    conn: Conn,
    chunk: Chunk,
    columns: list[tuple[str, str]],
    schema: pa.Schema,
    *,
    order_by: Sequence[str],
    block_bytes: int,
) -> Generator[pa.Table, None, None]:
    """The chunk's rows ordered by `order_by`, as tables of `schema` (see copy_batches)."""
    return copy_batches(conn, chunk.ident, columns, schema, order_by=order_by, block_bytes=block_bytes)


def live_rows(conn: Conn, table: str, since: datetime | None) -> tuple[pa.Table, str]:
    """The table's rows in the database (from `since`), typed as the archive types them; its time column."""
    columns = columns_of(conn, table)
    time_column = time_column_of(conn, table)
    schema = arrow_schema(columns)
    where = sql.SQL("{} >= %s").format(sql.Identifier(time_column)) if since else None
    batches = list(
        copy_batches(
            conn, sql.Identifier(table), columns, schema, where=where, params=(since,) if since else ()
        )
    )
    return (pa.concat_tables(batches) if batches else schema.empty_table()), time_column


def chunk_relations(conn: Conn, table: str) -> list[str]:
    """The names of `table`'s chunks (as show_chunks gives them), oldest first."""
    with translated(conn):
        rows = conn.execute("SELECT public.show_chunks(%s::regclass)", (table,)).fetchall()
    return [str(r[0]) for r in rows]


def read_chunks_binary(conn: Conn, relations: Iterable[str]) -> None:
    """Binary ``COPY (SELECT * FROM chunk) TO STDOUT`` of each chunk, read and thrown away (a baseline)."""
    with translated(conn), conn.cursor() as cursor:
        for relation in relations:
            statement = sql.SQL("COPY (SELECT * FROM {}) TO STDOUT (FORMAT BINARY)").format(sql.SQL(relation))
            with cursor.copy(statement) as copy:
                for _ in copy:
                    pass


def hypertable_bytes(conn: Conn, table: str) -> tuple[int, int]:
    """(heap + TOAST + indexes, heap only) of the hypertable's chunks, from chunks_detailed_size()."""
    with translated(conn):
        row = conn.execute(
            "SELECT sum(total_bytes), sum(table_bytes) FROM public.chunks_detailed_size(%s::regclass)",
            (table,),
        ).fetchone()
    if row is None or row[0] is None:
        return 0, 0
    return int(str(row[0])), int(str(row[1]))


def load_rows_binary(
    conn: Conn, table: str, columns: Sequence[str], types: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """Binary ``COPY table (columns) FROM STDIN`` of `rows` (`types`: their PostgreSQL types); no commit."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    with translated(conn), conn.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)

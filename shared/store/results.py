"""Running one statement and taking its rows, as dicts or tuples, on a sync or an async connection.

The helpers every family module uses; each translates driver errors
(`errors.translated`), whatever row factory the connection was opened with.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

from .errors import translated

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
Query = str | sql.SQL | sql.Composed
Row = dict[str, Any]  # a row by column name, in the statement's order (the API's answers say what each holds)


def dict_rows(conn: SyncConn, query: Query, params: Any = None) -> list[Row]:
    """Every row of `query` as a dict, on a sync connection; driver errors translated."""
    with translated(conn), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def tuple_rows(
    conn: SyncConn, query: Query, params: Any = None, *, prepare: bool | None = None
) -> list[tuple[Any, ...]]:
    """Every row of `query` as a tuple, on a sync connection; driver errors translated.
    `prepare`: psycopg's (None: prepared once run often; False: planned for its parameters each time)."""
    with translated(conn), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query, params, prepare=prepare)
        return cur.fetchall()


async def dict_rows_async(conn: AsyncConn, query: Query, params: Any = None) -> list[Row]:
    """Every row of `query` as a dict, on an async connection; driver errors translated."""
    with translated(conn):
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()

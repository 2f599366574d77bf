"""gpu_metrics, gpu_latest and gpu_assets: the sink's binary COPYs, its staging tables and its upserts.

A staging row is a decoded gpu-metrics-raw message in field order
(`STAGE_COLUMNS`): gpu_metrics' columns, then the identity columns that live
in gpu_assets only (`ASSET_ONLY`), then the message's schema_version, so one
row feeds gpu_metrics, gpu_latest and gpu_assets without being copied into a
narrower tuple. The column lists are derived from the contract model
(shared.contract.models), so the statements below cannot drift from it. Every
statement is built here, in Python, from those lists: none is read from the
database at run time (the migrations' `gpu_metrics_insert_sql()` is only read
by migration 0014, for its aggregate list).

Every function takes a cursor inside the caller's transaction; a failure
leaves translated (errors.translated): `AlreadyStoredError` when the straight
COPY meets rows stored before (a replay), `DataRefusedError` when the values
are at fault, another `DatabaseError` when the connection or server is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from shared.contract.models import METRIC_FIELDS, GpuSample
from shared.plumbing.errors import DataRefusedError

from .errors import translated

Row = tuple[Any, ...]
Cursor = psycopg.Cursor[tuple[object, ...]]

ASSET_ONLY = ("model", "gpu_index", "pci_bus_id", "driver_version")
PLAIN_COLUMNS = (
    "time",
    "gpu_uuid",
    "hostname",
    "cluster",
    "datacenter",
    "region",
    "rack",
    "job",
    "pod",
    "namespace",
    "container",
    "source",
    "collector_id",
    "collection_latency_ms",
)
METRIC_COLUMNS: tuple[str, ...] = (*PLAIN_COLUMNS, "mig", *METRIC_FIELDS)
STAGE_COLUMNS: tuple[str, ...] = (*METRIC_COLUMNS, *ASSET_ONLY, "schema_version")
GPU_UUID, TIME = STAGE_COLUMNS.index("gpu_uuid"), STAGE_COLUMNS.index("time")


def _pg_type(field: str) -> str:
    annotation = str(GpuSample.model_fields[field].annotation)
    return "double precision" if "float" in annotation else "bigint"


TEXT = "text"
STAGE_TYPES: tuple[str, ...] = (
    "timestamptz", *([TEXT] * 12), "double precision", "jsonb",
    *(_pg_type(f) for f in METRIC_FIELDS),
    TEXT, "smallint", TEXT, TEXT, "smallint",
)  # fmt: skip
WIDTH = len(METRIC_COLUMNS)  # a staging row starts with gpu_metrics' columns
_UNIQUE_VIOLATION = "23505"


class AlreadyStoredError(DataRefusedError):
    """The straight COPY met a row stored before: the batch is a replay (take the careful path)."""


def ident_list(names: Iterable[str]) -> sql.Composed:
    """Column names as a quoted, comma-separated list."""
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


@dataclass(frozen=True, slots=True)
class Stage:
    """A temporary table a batch is COPYed into, once per transaction (ON COMMIT DELETE ROWS)."""

    table: str
    columns: tuple[str, ...]
    types: tuple[str, ...]

    def create(self) -> sql.Composed:
        definition = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
            for c, t in zip(self.columns, self.types, strict=True)
        )
        return sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DELETE ROWS").format(
            sql.Identifier(self.table), definition
        )

    def copy_rows(self, cur: Cursor, rows: Iterable[Row]) -> None:
        """Binary COPY of the rows into this stage."""
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(self.table), ident_list(self.columns)
        )
        with translated(cur.connection), cur.copy(statement) as copy:
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)


METRICS_STAGE = Stage("_stage_metrics", STAGE_COLUMNS, STAGE_TYPES)
# The newest staged row of each GPU, and when the batch first saw it: gpu_latest and
# gpu_assets are upserted once per GPU, without sorting the whole batch in SQL.
LATEST_STAGE = Stage("_stage_latest", (*STAGE_COLUMNS, "first_seen"), (*STAGE_TYPES, "timestamptz"))

_COLS = ident_list(METRIC_COLUMNS)
_ASSET_COLS = (
    "gpu_uuid",
    *ASSET_ONLY,
    "hostname",
    "cluster",
    "datacenter",
    "region",
    "rack",
    "slowdown_temp_c",
    "shutdown_temp_c",
    "power_limit_w",
    "fb_total_mib",
)
# Limits a GPU reported once are kept when a later sample lacks them.
_KEEP_IF_NULL = {"slowdown_temp_c", "shutdown_temp_c", "power_limit_w", "fb_total_mib", "pci_bus_id"}
_UPDATE_LATEST = sql.SQL(", ").join(
    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in METRIC_COLUMNS if c != "gpu_uuid"
)
_UPDATE_ASSET = sql.SQL(", ").join(
    sql.SQL(
        "{0} = coalesce(EXCLUDED.{0}, gpu_assets.{0})" if c in _KEEP_IF_NULL else "{0} = EXCLUDED.{0}"
    ).format(sql.Identifier(c))
    for c in _ASSET_COLS[1:]
)
COPY_METRICS = sql.SQL("COPY gpu_metrics ({}) FROM STDIN (FORMAT BINARY)").format(_COLS)
_INSERT_STAGED = sql.SQL(
    "INSERT INTO gpu_metrics ({c}) SELECT {c} FROM _stage_metrics ON CONFLICT (gpu_uuid, time) DO NOTHING"
).format(c=_COLS)
_UPSERT_LATEST = sql.SQL(
    "INSERT INTO gpu_latest ({c}) SELECT {c} FROM _stage_latest"
    " ON CONFLICT (gpu_uuid) DO UPDATE SET {u} WHERE EXCLUDED.time > gpu_latest.time"
).format(c=_COLS, u=_UPDATE_LATEST)
_UPSERT_ASSETS = sql.SQL(
    "INSERT INTO gpu_assets ({a}, first_seen, last_seen)"
    " SELECT {a}, first_seen, time FROM _stage_latest"
    " ON CONFLICT (gpu_uuid) DO UPDATE SET {u},"
    " first_seen = least(gpu_assets.first_seen, EXCLUDED.first_seen), last_seen = EXCLUDED.last_seen"
    " WHERE EXCLUDED.last_seen >= gpu_assets.last_seen"
).format(a=ident_list(_ASSET_COLS), u=_UPDATE_ASSET)


def set_statement_timeout(conn: psycopg.Connection[Any], timeout_ms: int) -> None:
    """Bound every statement of this session (a slower one fails, and its batch is retried); committed."""
    with translated(conn):
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(int(timeout_ms))))
        conn.commit()


def prepare_writer_session(conn: psycopg.Connection[Any], stages: Iterable[Stage], timeout_ms: int) -> None:
    """A new writer connection: its statement timeout and its staging tables, committed."""
    set_statement_timeout(conn, timeout_ms)
    with translated(conn):
        for stage in stages:
            conn.execute(stage.create())
        conn.commit()


def copy_straight(cur: Cursor, rows: Iterable[Row], *, staging_rows: bool = True) -> None:
    """Binary COPY of rows straight into gpu_metrics: staging rows (their first WIDTH columns), or
    rows of gpu_metrics' columns exactly (`staging_rows=False`).

    AlreadyStoredError if one of them was stored before (a unique violation).
    """
    try:
        with translated(cur.connection), cur.copy(COPY_METRICS) as copy:
            copy.set_types(STAGE_TYPES[:WIDTH])
            if staging_rows:
                for row in rows:
                    copy.write_row(row[:WIDTH])
            else:
                for row in rows:
                    copy.write_row(row)
    except DataRefusedError as e:
        if getattr(e.__cause__, "sqlstate", None) == _UNIQUE_VIOLATION:
            raise AlreadyStoredError(str(e)) from e.__cause__
        raise


def insert_staged(cur: Cursor) -> int:
    """The staged samples into gpu_metrics, a replayed one adding nothing; the rows inserted."""
    with translated(cur.connection):
        cur.execute(_INSERT_STAGED)
        return cur.rowcount


def upsert_latest_and_assets(cur: Cursor) -> None:
    """gpu_latest and gpu_assets from the staged newest row of each GPU (never moving back in time)."""
    with translated(cur.connection):
        cur.execute(_UPSERT_LATEST)
        cur.execute(_UPSERT_ASSETS)


def truncate_stages(cur: Cursor, stages: Iterable[Stage]) -> None:
    """Empty the staging tables within the transaction (before a part of a batch is staged again)."""
    with translated(cur.connection):
        cur.execute(sql.SQL("TRUNCATE {}").format(ident_list(s.table for s in stages)))


def savepoint(cur: Cursor, name: str) -> None:
    with translated(cur.connection):
        cur.execute(sql.SQL("SAVEPOINT {}").format(sql.Identifier(name)))


def rollback_to(cur: Cursor, name: str, *, release: bool = False) -> None:
    """Undo what was done since the savepoint (and forget the savepoint if `release`)."""
    with translated(cur.connection):
        cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(sql.Identifier(name)))
        if release:
            cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(sql.Identifier(name)))


def release(cur: Cursor, name: str) -> None:
    with translated(cur.connection):
        cur.execute(sql.SQL("RELEASE SAVEPOINT {}").format(sql.Identifier(name)))

"""Rows the store's integration tests put in a migrated schema, and a way to call its async functions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from shared.settings.common import DatabaseSettings

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
Result = TypeVar("Result")


def gpu(i: int) -> str:
    return f"GPU-{i:08d}-0000-4000-8000-000000000000"


def on_async(
    db: DatabaseSettings, call: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Result]]
) -> Result:
    """`call` on a fresh async (autocommit) connection to `db`, as the API's pool hands them out."""

    async def run() -> Result:
        async with await psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True) as conn:
            return await call(conn)

    return asyncio.run(run())


def add_gpu(
    conn: psycopg.Connection[Any],
    i: int,
    *,
    host: str,
    rack: str | None = None,
    model: str = "NVIDIA H100 80GB HBM3",
) -> str:
    conn.execute(
        "INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, cluster, rack, first_seen, last_seen)"
        " VALUES (%s, %s, %s, %s, 'c1', %s, %s, %s)",
        (gpu(i), model, i % 8, host, rack, T0, T0),
    )
    return gpu(i)


def add_latest(conn: psycopg.Connection[Any], i: int, *, at: datetime, temp_c: float = 60.0) -> None:
    conn.execute(
        "INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c, power_usage_w,"
        " gpu_util_pct) SELECT %s, gpu_uuid, hostname, 'mock', 'test', %s, 300, 50 FROM gpu_assets"
        " WHERE gpu_uuid = %s",
        (at, temp_c, gpu(i)),
    )


def add_status(
    conn: psycopg.Connection[Any], i: int, *, state: str, score: float, as_of: datetime = T0
) -> None:
    conn.execute(
        "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, reasons, as_of)"
        " VALUES (%s, %s, %s, 'A', 'none', %s, %s)",
        (gpu(i), state, score, Jsonb([]), as_of),
    )


def add_alert(
    conn: psycopg.Connection[Any],
    i: int,
    *,
    kind: str,
    severity: str,
    state: str = "open",
    opened_at: datetime = T0,
) -> int:
    row = conn.execute(
        "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, evidence, opened_at, updated_at)"
        " VALUES (%s, %s, %s, %s, 'test', %s, %s, %s) RETURNING id",
        (gpu(i), kind, severity, state, Jsonb({}), opened_at, opened_at),
    ).fetchone()
    assert row is not None
    return int(row[0])

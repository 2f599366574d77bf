"""gpu_verifications, gpu_systems and gpu_systems_latest: the sink's inserts and the API's reads.

The sink stores each record once (`insert_verification`, `insert_system`: ON
CONFLICT DO NOTHING on the table's idempotency key, so a replay adds
nothing; a system also moves its host's latest identity, never backwards).
The API's reads take an async connection whose rows are dicts (dict_row) and
return them as they come, keyed by the statements' columns; keyset pages ask for `limit` rows and
say where the previous page ended.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from .errors import translated
from .results import Row

VERIFICATION_SQL = """
INSERT INTO gpu_verifications (time, gpu_uuid, seq, kind, name, outcome, hostname, device, backend,
    device_ms, cpu_ms, speedup, prev_sha256, sha256, record, source_partition, source_offset)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (gpu_uuid, time, sha256) DO NOTHING
"""
SYSTEM_SQL = """
INSERT INTO gpu_systems (time, hostname, identity_sha256, source, gpus, record)
VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
LATEST_SQL = """
INSERT INTO gpu_systems_latest (hostname, time, identity_sha256, source, gpus, record)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (hostname) DO UPDATE SET time = EXCLUDED.time, identity_sha256 = EXCLUDED.identity_sha256,
    source = EXCLUDED.source, gpus = EXCLUDED.gpus, record = EXCLUDED.record, updated_at = now()
WHERE gpu_systems_latest.time <= EXCLUDED.time
"""

AsyncConn = psycopg.AsyncConnection[Any]


def insert_verification(cur: psycopg.Cursor[Any], row: tuple[Any, ...]) -> int:
    """One verification row (VERIFICATION_SQL's column order); 1 if inserted, 0 if stored before."""
    with translated(cur.connection):
        cur.execute(VERIFICATION_SQL, row)
        return max(cur.rowcount, 0)


def insert_system(cur: psycopg.Cursor[Any], row: tuple[Any, ...]) -> int:
    """One system row (SYSTEM_SQL's column order) and its host's latest identity; 1 if inserted."""
    with translated(cur.connection):
        cur.execute(SYSTEM_SQL, row)
        inserted = max(cur.rowcount, 0)
        cur.execute(LATEST_SQL, row[1:2] + row[0:1] + row[2:])
    return inserted


_VERIFICATIONS_WHERE = """FROM gpu_verifications WHERE gpu_uuid = %(g)s
          AND (%(kind)s::text IS NULL OR kind = %(kind)s)
          AND (%(outcome)s::text IS NULL OR outcome = %(outcome)s)"""


async def _fetch(conn: AsyncConn, query: str, params: dict[str, Any]) -> list[Row]:
    with translated(conn):
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def verifications_page(
    conn: AsyncConn,
    gpu_uuid: str,
    *,
    kind: str | None,
    outcome: str | None,
    limit: int,
    after: tuple[int | None, datetime | None] = (None, None),
) -> list[Row]:
    """A GPU's records newest first (seq, time), those after the keyset `after`, at most `limit`."""
    params = {"g": gpu_uuid, "kind": kind, "outcome": outcome, "limit": limit, "cs": after[0], "ct": after[1]}
    return await _fetch(
        conn,
        f"""
        SELECT time, seq, kind, name, outcome, hostname, device, backend, device_ms, cpu_ms, speedup,
               prev_sha256, sha256, record, source_partition, source_offset {_VERIFICATIONS_WHERE}
          AND (%(cs)s::bigint IS NULL OR (seq, time) < (%(cs)s, %(ct)s::timestamptz))
        ORDER BY seq DESC, time DESC LIMIT %(limit)s
    """,
        params,
    )


async def verifications_count(
    conn: AsyncConn, gpu_uuid: str, *, kind: str | None, outcome: str | None
) -> int:
    """How many of a GPU's records the filters match."""
    found = await _fetch(
        conn,
        f"SELECT count(*) AS n {_VERIFICATIONS_WHERE}",
        {"g": gpu_uuid, "kind": kind, "outcome": outcome},
    )
    return int(found[0]["n"])


async def systems_page(conn: AsyncConn, *, limit: int, after: str | None = None) -> list[Row]:
    """Every node's latest identity in brief, by hostname, those after `after`, at most `limit`."""
    return await _fetch(
        conn,
        """
        SELECT hostname, time, identity_sha256, source, gpus,
               record->'host'->>'cpu_model' AS cpu_model, record->>'driver_version' AS driver_version,
               coalesce((SELECT array_agg(DISTINCT g->>'model')
                         FROM jsonb_array_elements(CASE jsonb_typeof(record->'gpus') WHEN 'array'
                                                   THEN record->'gpus' ELSE '[]' END) g), '{}') AS gpu_models
        FROM gpu_systems_latest WHERE %(after)s::text IS NULL OR hostname > %(after)s
        ORDER BY hostname LIMIT %(limit)s
    """,
        {"limit": limit, "after": after},
    )


async def systems_count(conn: AsyncConn) -> int:
    return int((await _fetch(conn, "SELECT count(*) AS n FROM gpu_systems_latest", {}))[0]["n"])


async def system_latest(conn: AsyncConn, hostname: str) -> Row | None:
    """A node's latest announced identity (None: never announced)."""
    found = await _fetch(
        conn,
        "SELECT time, identity_sha256, record FROM gpu_systems_latest WHERE hostname = %(h)s",
        {"h": hostname},
    )
    return found[0] if found else None


async def system_history_count(conn: AsyncConn, hostname: str) -> int:
    found = await _fetch(
        conn, "SELECT count(*) AS n FROM gpu_systems WHERE hostname = %(h)s", {"h": hostname}
    )
    return int(found[0]["n"])


async def system_history_page(
    conn: AsyncConn, hostname: str, *, limit: int, after: tuple[datetime | None, str | None] = (None, None)
) -> list[Row]:
    """Every identity the node announced, newest first, those after the keyset `after`, at most `limit`."""
    return await _fetch(
        conn,
        """
        SELECT time, identity_sha256, source, gpus, record FROM gpu_systems
        WHERE hostname = %(h)s
          AND (%(ct)s::timestamptz IS NULL OR (time, identity_sha256) < (%(ct)s, %(ci)s::text))
        ORDER BY time DESC, identity_sha256 DESC LIMIT %(limit)s
    """,
        {"h": hostname, "limit": limit, "ct": after[0], "ci": after[1]},
    )

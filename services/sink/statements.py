"""The sink's SQL: the staging tables a batch is COPYed into, and the statements that store it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from .rows import ASSET_ONLY, EVENT_COLUMNS, EVENT_TYPES, METRIC_COLUMNS, STAGE_COLUMNS, STAGE_TYPES


def _ident_list(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


_COLS = _ident_list(METRIC_COLUMNS)
WIDTH = len(METRIC_COLUMNS)  # a staging row starts with gpu_metrics' columns
_UPDATE_LATEST = sql.SQL(", ").join(
    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in METRIC_COLUMNS if c != "gpu_uuid"
)
_ASSET_COLS = (
    "gpu_uuid", *ASSET_ONLY, "hostname", "cluster", "datacenter", "region", "rack",
    "slowdown_temp_c", "shutdown_temp_c", "power_limit_w", "fb_total_mib",
)  # fmt: skip
# Limits a GPU reported once are kept when a later sample lacks them.
_KEEP_IF_NULL = {
    "slowdown_temp_c",
    "shutdown_temp_c",
    "power_limit_w",
    "fb_total_mib",
    "pci_bus_id",
}
_UPDATE_ASSET = sql.SQL(", ").join(
    sql.SQL(
        "{0} = coalesce(EXCLUDED.{0}, gpu_assets.{0})" if c in _KEEP_IF_NULL else "{0} = EXCLUDED.{0}"
    ).format(sql.Identifier(c))
    for c in _ASSET_COLS[1:]
)


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

    def copy_rows(self, cur: psycopg.Cursor[tuple[object, ...]], rows: Iterable[tuple[Any, ...]]) -> None:
        """Binary COPY of the rows into this stage."""
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(self.table), _ident_list(self.columns)
        )
        with cur.copy(statement) as copy:
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)


METRICS_STAGE = Stage("_stage_metrics", STAGE_COLUMNS, STAGE_TYPES)
# The newest staged row of each GPU, and when the batch first saw it: gpu_latest and
# gpu_assets are upserted once per GPU, without sorting the whole batch in SQL.
LATEST_STAGE = Stage("_stage_latest", (*STAGE_COLUMNS, "first_seen"), (*STAGE_TYPES, "timestamptz"))
EVENTS_STAGE = Stage("_stage_events", EVENT_COLUMNS, EVENT_TYPES)

STATEMENTS: dict[str, sql.Composed | sql.SQL] = {
    "copy": sql.SQL("COPY gpu_metrics ({}) FROM STDIN (FORMAT BINARY)").format(_COLS),
    "metrics": sql.SQL(
        "INSERT INTO gpu_metrics ({c}) SELECT {c} FROM _stage_metrics ON CONFLICT (gpu_uuid, time) DO NOTHING"
    ).format(c=_COLS),
    "note": sql.SQL(
        "INSERT INTO gpu_metrics_1min_pending (bucket)"
        " SELECT DISTINCT time_bucket(interval '1 minute', t) FROM unnest(%s::timestamptz[]) AS t"
    ),
    "latest": sql.SQL(
        "INSERT INTO gpu_latest ({c}) SELECT {c} FROM _stage_latest"
        " ON CONFLICT (gpu_uuid) DO UPDATE SET {u} WHERE EXCLUDED.time > gpu_latest.time"
    ).format(c=_COLS, u=_UPDATE_LATEST),
    "assets": sql.SQL(
        "INSERT INTO gpu_assets ({a}, first_seen, last_seen)"
        " SELECT {a}, first_seen, time FROM _stage_latest"
        " ON CONFLICT (gpu_uuid) DO UPDATE SET {u},"
        " first_seen = least(gpu_assets.first_seen, EXCLUDED.first_seen), last_seen = EXCLUDED.last_seen"
        " WHERE EXCLUDED.last_seen >= gpu_assets.last_seen"
    ).format(a=_ident_list(_ASSET_COLS), u=_UPDATE_ASSET),
    "events": sql.SQL(
        "INSERT INTO gpu_events ({c}) SELECT {c} FROM _stage_events"
        " ON CONFLICT (gpu_uuid, time, kind) DO NOTHING"
    ).format(c=_ident_list(EVENT_COLUMNS)),
    "offsets": sql.SQL(
        "INSERT INTO kafka_offsets (consumer_group, topic, partition, next_offset)"
        " VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (consumer_group, topic, partition) DO UPDATE"
        " SET next_offset = greatest(kafka_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()"
    ),
}

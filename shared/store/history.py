"""Series and events over time for the API: one GPU's metrics in buckets, the fleet's events.

Buckets of a minute and up read the 1-minute rollup (gpu_metrics_1min), finer
ones the raw samples (gpu_metrics). Rows are dicts keyed by the statements'
columns (a bucket: `t`, temp_c, temp_max_c, power_w, util_pct, then each of
COUNTERS' names, their max); times stay datetimes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .results import Row, dict_rows, dict_rows_async

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]

# Series of the counters behind findings (name in the answer -> column; the rollup keeps `<column>_max`).
COUNTERS = {
    "fb_used_mib": "fb_used_mib", "ecc_sbe": "ecc_sbe_volatile_total", "ecc_dbe": "ecc_dbe_volatile_total",
    "retired_pages_sbe": "retired_pages_sbe", "retired_pages_dbe": "retired_pages_dbe",
    "retired_pages_pending": "retired_pages_pending", "remapped_rows_uncorrectable": "remapped_rows_uncorrectable",
    "row_remap_failure": "row_remap_failure", "pcie_replay": "pcie_replay_total", "xid_last": "xid_last",
    "nvlink_crc_flit_errors": "nvlink_crc_flit_errors_total", "nvlink_crc_data_errors": "nvlink_crc_data_errors_total",
    "nvlink_replay_errors": "nvlink_replay_errors_total", "nvlink_recovery_errors": "nvlink_recovery_errors_total",
    "power_violation_us": "power_violation_us", "thermal_violation_us": "thermal_violation_us",
}  # fmt: skip

_RAW_COUNTERS = ", ".join(f"max({column}) AS {name}" for name, column in COUNTERS.items())
_ROLLUP_COUNTERS = ", ".join(f"max({column}_max) AS {name}" for name, column in COUNTERS.items())
_RAW_SERIES = f"""SELECT public.time_bucket(%(b)s, time) AS t, avg(gpu_temp_c) AS temp_c, max(gpu_temp_c) AS temp_max_c,
                          avg(power_usage_w) AS power_w, avg(gpu_util_pct) AS util_pct, {_RAW_COUNTERS}
                   FROM gpu_metrics WHERE gpu_uuid = %(g)s AND time >= %(from)s AND time < %(to)s
                   GROUP BY t ORDER BY t"""
_ROLLUP_SERIES = f"""SELECT public.time_bucket(%(b)s, bucket) AS t,
                          sum(gpu_temp_c_sum) / nullif(sum(gpu_temp_c_n), 0) AS temp_c, max(gpu_temp_c_max) AS temp_max_c,
                          sum(power_usage_w_sum) / nullif(sum(power_usage_w_n), 0) AS power_w,
                          sum(gpu_util_pct_sum) / nullif(sum(gpu_util_pct_n), 0) AS util_pct, {_ROLLUP_COUNTERS}
                   FROM gpu_metrics_1min WHERE gpu_uuid = %(g)s AND bucket >= %(from)s AND bucket < %(to)s
                   GROUP BY t ORDER BY t"""


def _series(gpu_uuid: str, start: datetime, end: datetime, bucket_s: int) -> tuple[str, dict[str, Any]]:
    params = {"g": gpu_uuid, "from": start, "to": end, "b": timedelta(seconds=bucket_s)}
    return (_RAW_SERIES if bucket_s < 60 else _ROLLUP_SERIES), params


async def series(
    conn: AsyncConn, gpu_uuid: str, *, start: datetime, end: datetime, bucket_s: int
) -> list[Row]:
    """One GPU's metrics from `start` to `end` (exclusive) in buckets of `bucket_s` seconds (SeriesPoint rows)."""
    return await dict_rows_async(conn, *_series(gpu_uuid, start, end, bucket_s))


def series_sync(conn: SyncConn, gpu_uuid: str, *, start: datetime, end: datetime, bucket_s: int) -> list[Row]:
    """`series` on a sync connection (the bench's baseline)."""
    return dict_rows(conn, *_series(gpu_uuid, start, end, bucket_s))


@dataclass(frozen=True, slots=True)
class EventFilters:
    """The event list's filters: a time range (start inclusive, end exclusive), optionally one GPU, one kind."""

    start: datetime
    end: datetime
    gpu: str | None = None
    kind: str | None = None


_EVENTS_WHERE = """
        WHERE time >= %(from)s AND time < %(to)s AND (%(gpu)s::text IS NULL OR gpu_uuid = %(gpu)s)
          AND (%(kind)s::text IS NULL OR kind = %(kind)s)"""


async def events(
    conn: AsyncConn, filters: EventFilters, *, limit: int, after: tuple[datetime, str, str] | None
) -> tuple[list[Row], int]:
    """Events newest first, after the (time, gpu_uuid, kind) key `after`; and the total the filters match."""
    ct, cg, ck = after or (None, None, None)
    params = {
        "from": filters.start,
        "to": filters.end,
        "gpu": filters.gpu,
        "kind": filters.kind,
        "limit": limit,
        "ct": ct,
        "cg": cg,
        "ck": ck,
    }
    found = await dict_rows_async(
        conn,
        f"""
        SELECT time, gpu_uuid, kind, hostname, cluster, datacenter, rack, details FROM gpu_events {_EVENTS_WHERE}
          AND (%(ct)s::timestamptz IS NULL OR (time, gpu_uuid, kind) < (%(ct)s, %(cg)s::text, %(ck)s::text))
        ORDER BY time DESC, gpu_uuid DESC, kind DESC LIMIT %(limit)s
    """,
        params,
    )
    total = await dict_rows_async(conn, f"SELECT count(*) AS n FROM gpu_events {_EVENTS_WHERE}", params)
    return found, int(total[0]["n"])

"""What the rules need to know about every GPU as of a time, computed in SQL over the rollup.

One query per cycle reads the 1-minute rollup for the long window and folds it
per GPU (counter increments use lag(), so a counter reset by a GPU reset is
not a negative rate); one reads XID events; one joins the inventory and the
latest sample. Nothing pulls raw samples into Python: at 10,000 GPUs a cycle
reads ~600k rollup rows inside PostgreSQL and returns 10,000. Only refreshed
minutes are read: those before gpu_metrics_1min_settled() (schema/0014).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg

from shared.wire_time import wire_time

from .rules_config import Rules

Conn = psycopg.Connection[tuple[Any, ...]]


class XidCounts(NamedTuple):
    """One XID code's occurrences on a GPU; plain (recent, total) tuples are accepted too."""

    recent: int  # within the code's time-to-clear
    total: int  # within the escalation window
    in_repeat_window: int | None = None  # within xid_repeats.window_s (None: use `recent`)
    times: tuple[str, ...] = ()  # the newest occurrences, ISO-8601, newest first


XidValue = XidCounts | tuple[int, int]


@dataclass(slots=True)
class GpuFeatures:
    gpu_uuid: str
    hostname: str
    model: str
    last_time: datetime | None
    slowdown_c: float
    power_limit_w: float | None
    fb_total_mib: int | None
    pod: str | None = None
    fb_used_mib: int | None = None
    recovery_action: int | None = None  # NVML's GPU recovery action in the latest sample
    # state at the newest minute in the long window
    dbe_volatile: int = 0
    retired_pages: int = 0
    retired_pending: int = 0
    remap_failure: int = 0
    remap_pending: int = 0
    remapped_uncorrectable: int = 0
    # short window
    temp_max: float | None = None
    power_avg: float | None = None
    reasons_any: int = 0
    util_max_idle_window: float | None = None
    idle_minutes: int = 0
    # long window increments
    sbe_new: int = 0
    pcie_new: int = 0
    nvlink_crc_new: int = 0
    nvlink_replay_recovery_new: int = 0
    dbe_new: int = 0
    minutes_long: int = 0
    # seconds between the first and the newest rollup minute of the long window: rates are
    # increments over elapsed time (None: fall back to the number of minutes seen)
    span_long_s: float | None = None
    # XIDs: code -> XidCounts (or a plain (recent, total) tuple)
    xids: dict[int, XidValue] = field(default_factory=dict)
    # times this GPU was lost (gpu_lost events) in the escalation window, newest first
    lost_times: tuple[str, ...] = ()


_ROLLUP = """
WITH win AS (
    SELECT gpu_uuid, bucket, gpu_temp_c_max, power_usage_w_sum, power_usage_w_n,
           gpu_util_pct_sum, gpu_util_pct_n, clocks_event_reasons_any, fb_used_mib_max,
           ecc_dbe_volatile_total_max, retired_pages_sbe_max, retired_pages_dbe_max,
           retired_pages_pending_max, row_remap_failure_max, remapped_rows_uncorrectable_max,
           ecc_sbe_volatile_total_max - lag(ecc_sbe_volatile_total_max) OVER w AS d_sbe,
           ecc_dbe_volatile_total_max - lag(ecc_dbe_volatile_total_max) OVER w AS d_dbe,
           pcie_replay_total_max - lag(pcie_replay_total_max) OVER w AS d_pcie,
           (coalesce(nvlink_crc_flit_errors_total_max, 0) + coalesce(nvlink_crc_data_errors_total_max, 0))
             - lag(coalesce(nvlink_crc_flit_errors_total_max, 0) + coalesce(nvlink_crc_data_errors_total_max, 0)) OVER w AS d_crc,
           (coalesce(nvlink_replay_errors_total_max, 0) + coalesce(nvlink_recovery_errors_total_max, 0))
             - lag(coalesce(nvlink_replay_errors_total_max, 0) + coalesce(nvlink_recovery_errors_total_max, 0)) OVER w AS d_nvl
    FROM gpu_metrics_1min
    WHERE bucket > %(t)s - %(long)s AND bucket <= %(t)s AND bucket < (SELECT gpu_metrics_1min_settled())
    WINDOW w AS (PARTITION BY gpu_uuid ORDER BY bucket)
)
SELECT gpu_uuid,
       (array_agg(ecc_dbe_volatile_total_max ORDER BY bucket DESC))[1],
       (array_agg(coalesce(retired_pages_sbe_max, 0) + coalesce(retired_pages_dbe_max, 0) ORDER BY bucket DESC))[1],
       (array_agg(retired_pages_pending_max ORDER BY bucket DESC))[1],
       (array_agg(row_remap_failure_max ORDER BY bucket DESC))[1],
       (array_agg(remapped_rows_uncorrectable_max ORDER BY bucket DESC))[1],
       max(gpu_temp_c_max) FILTER (WHERE bucket > %(t)s - %(short)s),
       sum(power_usage_w_sum) FILTER (WHERE bucket > %(t)s - %(short)s)
         / nullif(sum(power_usage_w_n) FILTER (WHERE bucket > %(t)s - %(short)s), 0),
       bit_or(clocks_event_reasons_any) FILTER (WHERE bucket > %(t)s - %(short)s),
       max(gpu_util_pct_sum / nullif(gpu_util_pct_n, 0)) FILTER (WHERE bucket > %(t)s - %(idle)s),
       count(*) FILTER (WHERE bucket > %(t)s - %(idle)s),
       sum(greatest(d_sbe, 0)), sum(greatest(d_pcie, 0)), sum(greatest(d_crc, 0)),
       sum(greatest(d_nvl, 0)), sum(greatest(d_dbe, 0)), count(*),
       extract(epoch FROM max(bucket) - min(bucket))
FROM win GROUP BY gpu_uuid
"""

_INVENTORY = """
SELECT a.gpu_uuid, a.hostname, a.model,
       CASE WHEN l.time <= %(t)s THEN l.time ELSE (
           SELECT max(bucket) + interval '59 seconds' FROM gpu_metrics_1min r
           WHERE r.gpu_uuid = a.gpu_uuid AND r.bucket <= %(t)s AND r.bucket > %(t)s - %(long)s
             AND r.bucket < (SELECT gpu_metrics_1min_settled()))
       END,
       coalesce(a.slowdown_temp_c, %(slowdown)s),
       a.power_limit_w, a.fb_total_mib, l.pod, l.fb_used_mib, l.row_remap_pending,
       l.gpu_recovery_action
FROM gpu_assets a LEFT JOIN gpu_latest l USING (gpu_uuid)
WHERE a.first_seen <= %(t)s
"""

_XIDS = """
WITH e AS (
    SELECT gpu_uuid, (details->>'xid')::int AS code, time
    FROM gpu_events
    WHERE kind = 'xid' AND time > %(t)s - %(escalation)s AND time <= %(t)s AND details ? 'xid'
)
SELECT e.gpu_uuid, e.code,
       count(*) FILTER (WHERE e.time > %(t)s - make_interval(secs => coalesce(c.clear_s, %(xid_s)s))),
       count(*), count(*) FILTER (WHERE e.time > %(t)s - %(repeat)s),
       (array_agg(e.time ORDER BY e.time DESC))[1:10]
FROM e LEFT JOIN unnest(%(codes)s::int[], %(clears)s::int[]) AS c(code, clear_s) ON c.code = e.code
GROUP BY e.gpu_uuid, e.code
"""

_LOSSES = """
SELECT gpu_uuid, (array_agg(time ORDER BY time DESC))[1:10], count(*)
FROM gpu_events
WHERE kind = 'gpu_lost' AND time > %(t)s - %(escalation)s AND time <= %(t)s
GROUP BY gpu_uuid
"""


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def read_features(conn: Conn, as_of: datetime, rules: Rules) -> dict[str, GpuFeatures]:
    w = rules.windows
    params = {
        "t": as_of,
        "short": timedelta(seconds=w.short_s),
        "long": timedelta(seconds=w.long_s),
        "idle": timedelta(seconds=rules.idle.for_s),
        "xid": timedelta(seconds=w.xid_s),
        "escalation": timedelta(seconds=w.escalation_s),
        "slowdown": rules.thermal.default_slowdown_c,
        "xid_s": w.xid_s,
        "repeat": timedelta(seconds=rules.xid_repeats.window_s),
        "codes": list(rules.xid),
        "clears": [rules.xid_clear_s(code) for code in rules.xid],
    }
    gpus: dict[str, GpuFeatures] = {}
    for row in conn.execute(_INVENTORY, params):
        uuid, host, model, last, slow, plimit, fbtotal, pod, fbused, remap_pending, recovery = row
        gpus[uuid] = GpuFeatures(
            gpu_uuid=uuid, hostname=host, model=model, last_time=last, slowdown_c=float(slow),
            power_limit_w=plimit, fb_total_mib=fbtotal, pod=pod,
            fb_used_mib=fbused, remap_pending=_int(remap_pending), recovery_action=recovery,
        )  # fmt: skip
    for row in conn.execute(_ROLLUP, params):
        g = gpus.get(row[0])
        if g is None:
            continue
        (g.dbe_volatile, g.retired_pages, g.retired_pending, g.remap_failure, g.remapped_uncorrectable) = (
            _int(v) for v in row[1:6]
        )
        g.temp_max, g.power_avg = row[6], row[7]
        g.reasons_any = _int(row[8])
        g.util_max_idle_window, g.idle_minutes = row[9], _int(row[10])
        g.sbe_new, g.pcie_new, g.nvlink_crc_new, g.nvlink_replay_recovery_new, g.dbe_new = (
            _int(v) for v in row[11:16]
        )
        g.minutes_long = _int(row[16])
        g.span_long_s = float(row[17]) if row[17] is not None else None
    for uuid, code, recent, total, in_repeat, times in conn.execute(_XIDS, params):
        if uuid in gpus:
            stamps = tuple(wire_time(t) for t in times)
            gpus[uuid].xids[int(code)] = XidCounts(int(recent), int(total), int(in_repeat), stamps)
    for uuid, times, _count in conn.execute(_LOSSES, params):
        if uuid in gpus:
            gpus[uuid].lost_times = tuple(wire_time(t) for t in times)
    return gpus

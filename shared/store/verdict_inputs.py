"""The scorer's inputs: feature and prediction windows over gpu_metrics_1min, events, the inventory.

Every read of the rollup stops at gpu_metrics_1min_settled() (schema/0014): a
minute the sink has not refreshed yet is never judged; what a GPU's memory
events said since its newest settled minute is read beside it (`event_state`).
Each statement reads every GPU or only the given ones (the event fast path
judges one, a scorer process its partitions' share). Rows are NamedTuples in
the statements' column order; the scorer folds them into its features.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg

from .events import LAST, LINES
from .results import tuple_rows
from .verdict_rows import (
    EventStateRow,
    InventoryRow,
    LossRow,
    PatternRow,
    PrecursorRow,
    RemedyRow,
    RollupRow,
    XidEventRow,
    XidRow,
)

SyncConn = psycopg.Connection[Any]
_Row = TypeVar("_Row", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureWindows:
    """How far back the features look from `as_of`, and the defaults the rules give."""

    as_of: datetime
    short_s: int  # thermal, power, throttling
    long_s: int  # counter increments, the newest state of the counters
    idle_s: int  # the idle-while-allocated window
    escalation_s: int  # XIDs and losses counted for escalation
    repeat_s: int  # the XID repeat window
    xid_s: int  # how long an XID not in `xid_clear_s` counts as recent
    default_slowdown_c: float  # for a GPU that never reported its own slowdown temperature
    xid_clear_s: dict[int, int]  # per XID code: how long it counts as recent
    # XIDs whose verdict depends on what accompanies them: their newest events, with messages
    workflow_codes: tuple[int, ...] = ()
    workflow_s: int = 86400  # how far back their events are read
    events_per_code: int = 20  # at most this many of each code per GPU, newest first
    # pattern rules: what each counts and cancels on ([{idx, kinds, codes, reach_s, burst_s, cancel_kinds,
    # cancel_codes}]; kinds: event kinds, "changed", "recovered", "remediated"), the event kinds any
    # reads, the reach
    patterns: tuple[dict[str, Any], ...] = ()
    pattern_kinds: tuple[str, ...] = ()
    pattern_reach_s: float = 0.0
    bursts_per_pattern: int = 200  # per GPU and pattern, the newest
    # XID codes a remedy resolves (gpu_remedies, schema/0080): occurrences up to the GPU's newest remedy
    # of that rung are not counted. A reset resolves `reset_codes`; a reboot those and `reboot_codes`
    # (and losses of the GPU).
    reset_codes: tuple[int, ...] = ()
    reboot_codes: tuple[int, ...] = ()
    recur_codes: tuple[int, ...] = ()  # those that call for a reset or a reboot: seen again, they recurred
    gpus: tuple[str, ...] | None = None  # only these GPUs (None: every GPU)

    def params(self) -> dict[str, Any]:
        return {
            "gpus": None if self.gpus is None else list(self.gpus),
            "t": self.as_of,
            "short": timedelta(seconds=self.short_s),
            "long": timedelta(seconds=self.long_s),
            "idle": timedelta(seconds=self.idle_s),
            "xid": timedelta(seconds=self.xid_s),
            "escalation": timedelta(seconds=self.escalation_s),
            "slowdown": self.default_slowdown_c,
            "xid_s": self.xid_s,
            "repeat": timedelta(seconds=self.repeat_s),
            "codes": list(self.xid_clear_s),
            "clears": list(self.xid_clear_s.values()),
            "workflow_codes": list(self.workflow_codes),
            "workflow": timedelta(seconds=self.workflow_s),
            "per_code": self.events_per_code,
            "patterns": json.dumps(list(self.patterns)),
            "pattern_kinds": list(self.pattern_kinds),
            "pattern_reach": timedelta(seconds=self.pattern_reach_s),
            "pattern_bursts": self.bursts_per_pattern,
            "reset_codes": list(self.reset_codes),
            "reboot_codes": list(self.reboot_codes),
            "recur_codes": list(self.recur_codes),
            "recurred": any(k.startswith("recurred:") for k in self.pattern_kinds),
            "remedy_kinds": [k for k in self.pattern_kinds if k.startswith("remedy:")],
        }


# The newest operator mark of each GPU (gpu_repairs, schema/0031): the scorer counts nothing before it.
_REPAIRED = (
    "repaired AS (SELECT gpu_uuid, max(time) AS since FROM gpu_repairs WHERE time <= %(t)s GROUP BY gpu_uuid)"
)
_SINCE = "coalesce(since, '-infinity')"
# Each GPU's newest remedy (gpu_remedies, schema/0080) of either rung, and its newest reboot: what a
# remedy resolves is not counted from before it; the history keeps it.
_REMEDIED = (
    "remedied AS (SELECT gpu_uuid, max(at) AS reset_at, max(at) FILTER (WHERE remedy = 'reboot_node') AS reboot_at"
    " FROM gpu_remedies WHERE at <= %(t)s AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))"
    " GROUP BY gpu_uuid)"
)


def _unresolved(code: str, time: str) -> str:
    """An XID occurrence (`code` at `time`) that no remedy of the GPU since resolved."""
    return (
        f"NOT (({code} = ANY(%(reset_codes)s::int[]) AND {time} <= coalesce(reset_at, '-infinity'))"
        f" OR ({code} = ANY(%(reboot_codes)s::int[]) AND {time} <= coalesce(reboot_at, '-infinity')))"
    )


_ROLLUP = f"""
WITH {_REPAIRED}, win AS (
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
    FROM gpu_metrics_1min LEFT JOIN repaired USING (gpu_uuid)
    WHERE bucket > %(t)s - %(long)s AND bucket <= %(t)s AND bucket < (SELECT gpu_metrics_1min_settled())
      AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[])) AND bucket > {_SINCE}
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


# A GPU whose latest sample is newer than as_of (a replay; or, live, one stored between as_of and this
# read) was last seen at its newest raw sample up to as_of; once raw samples are dropped, at the end of
# its newest settled rollup minute. (The rollup alone put a GPU that reported a second after as_of a
# settling delay behind, and so "not reporting".)
_INVENTORY = """
SELECT a.gpu_uuid, a.hostname, a.model,
       CASE WHEN l.time <= %(t)s THEN l.time ELSE coalesce((
           SELECT max(m.time) FROM gpu_metrics m
           WHERE m.gpu_uuid = a.gpu_uuid AND m.time <= %(t)s AND m.time > %(t)s - %(long)s), (
           SELECT max(bucket) + interval '59 seconds' FROM gpu_metrics_1min r
           WHERE r.gpu_uuid = a.gpu_uuid AND r.bucket <= %(t)s AND r.bucket > %(t)s - %(long)s
             AND r.bucket < (SELECT gpu_metrics_1min_settled())))
       END,
       coalesce(a.slowdown_temp_c, %(slowdown)s),
       a.power_limit_w, a.fb_total_mib, l.pod, l.fb_used_mib, l.row_remap_pending,
       l.gpu_recovery_action, a.driver_version
FROM gpu_assets a LEFT JOIN gpu_latest l USING (gpu_uuid)
WHERE a.first_seen <= %(t)s AND (%(gpus)s::text[] IS NULL OR a.gpu_uuid = ANY(%(gpus)s::text[]))
"""


_XIDS = f"""
WITH {_REPAIRED}, {_REMEDIED}, e AS (
    SELECT gpu_uuid, (details->>'xid')::int AS code, time, {LINES} AS lines
    FROM gpu_events LEFT JOIN repaired USING (gpu_uuid) LEFT JOIN remedied USING (gpu_uuid)
    WHERE kind = 'xid' AND time > %(t)s - %(escalation)s AND time <= %(t)s AND details ? 'xid'
      AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[])) AND time > {_SINCE}
      AND {_unresolved("(details->>'xid')::int", "time")}
)
SELECT e.gpu_uuid, e.code,
       coalesce(sum(e.lines) FILTER (WHERE e.time > %(t)s - make_interval(secs => coalesce(c.clear_s, %(xid_s)s))), 0),
       sum(e.lines), coalesce(sum(e.lines) FILTER (WHERE e.time > %(t)s - %(repeat)s), 0),
       (array_agg(e.time ORDER BY e.time DESC))[1:10]
FROM e LEFT JOIN unnest(%(codes)s::int[], %(clears)s::int[]) AS c(code, clear_s) ON c.code = e.code
GROUP BY e.gpu_uuid, e.code
"""


_XID_EVENTS = f"""
WITH {_REPAIRED}, {_REMEDIED}
SELECT gpu_uuid, code, time, source, message FROM (
    SELECT gpu_uuid, (details->>'xid')::int AS code, time, source, details->>'kernel_message' AS message,
           row_number() OVER (PARTITION BY gpu_uuid, details->>'xid' ORDER BY time DESC) AS n
    FROM gpu_events LEFT JOIN repaired USING (gpu_uuid) LEFT JOIN remedied USING (gpu_uuid)
    WHERE kind = 'xid' AND time > %(t)s - %(workflow)s AND time <= %(t)s AND details ? 'xid'
      AND (details->>'xid')::int = ANY(%(workflow_codes)s::int[]) AND time > {_SINCE}
      AND {_unresolved("(details->>'xid')::int", "time")}
      AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
) e
WHERE n <= %(per_code)s
ORDER BY gpu_uuid, code, time DESC
"""


_PATTERNS = f"""
WITH {_REPAIRED}, p AS (
    SELECT * FROM jsonb_to_recordset(%(patterns)s::jsonb)
      AS p(idx int, kinds text[], codes int[], reach_s float8, burst_s float8, cancel_kinds text[], cancel_codes int[],
           within_s float8)
), verdicts AS (  -- changes of a subsystem's verdict; the history subsystem is the patterns' own
    SELECT gpu_uuid, time, state, lag(state) OVER (PARTITION BY gpu_uuid, subsystem ORDER BY time) AS before
    FROM gpu_health
    WHERE time > %(t)s - 2 * %(pattern_reach)s AND time <= %(t)s AND subsystem <> 'history'
      AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
), signals AS (  -- a folded XID is `lines` signals from its time to `last`
    SELECT s.gpu_uuid, s.time, s.last, s.lines, s.kind, s.code, s.after_s FROM (
        SELECT gpu_uuid, time, CASE WHEN kind = 'xid' THEN {LAST} ELSE time END AS last,
               CASE WHEN kind = 'xid' THEN {LINES} ELSE 1 END AS lines, kind,
               CASE WHEN kind = 'xid' THEN (details->>'xid')::int END AS code, NULL::float8 AS after_s
        FROM gpu_events
        WHERE time > %(t)s - %(pattern_reach)s AND time <= %(t)s AND kind = ANY(%(pattern_kinds)s::text[])
          AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
        UNION ALL  -- any change of state; and a remediation that took: unhealthy became healthy again
        SELECT gpu_uuid, time, time, 1, 'changed', NULL, NULL FROM verdicts WHERE time > %(t)s - %(pattern_reach)s
        UNION ALL
        SELECT gpu_uuid, time, time, 1, 'recovered', NULL, NULL FROM verdicts
        WHERE state = 'healthy' AND before = 'unhealthy' AND time > %(t)s - %(pattern_reach)s
        UNION ALL  -- a live plan of the remediator's that started on the GPU's node for it (schema/0030)
        SELECT g, created_at, created_at, 1, 'remediated', NULL, NULL FROM remediations, unnest(gpu_uuids) g
        WHERE NOT dry_run AND held_for IS NULL AND created_at > %(t)s - %(pattern_reach)s AND created_at <= %(t)s
          AND (%(gpus)s::text[] IS NULL OR g = ANY(%(gpus)s::text[]))
        UNION ALL  -- a remedy carried out (schema/0080): remedy:reset_gpu, remedy:reboot_node
        SELECT gpu_uuid, at, at, 1, 'remedy:' || remedy, NULL, NULL FROM gpu_remedies
        WHERE 'remedy:' || remedy = ANY(%(remedy_kinds)s::text[]) AND at > %(t)s - %(pattern_reach)s AND at <= %(t)s
          AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
        UNION ALL  -- what a remedy resolved, seen again after it: recurred:<the remedy>, after_s after it
        SELECT e.gpu_uuid, e.time, e.time, 1, 'recurred:' || r.remedy, NULL, extract(epoch FROM e.time - r.at)
        FROM gpu_events e CROSS JOIN LATERAL (
            SELECT g.remedy, g.at FROM gpu_remedies g
            WHERE g.gpu_uuid = e.gpu_uuid AND g.at < e.time AND g.at > e.time - %(pattern_reach)s
              AND (g.remedy = 'reboot_node' OR (e.details->>'xid')::int = ANY(%(reset_codes)s::int[]))
            ORDER BY g.at DESC LIMIT 1) r
        WHERE %(recurred)s AND e.time > %(t)s - %(pattern_reach)s AND e.time <= %(t)s
          AND (e.kind = 'gpu_lost' OR (e.kind = 'xid' AND e.details ? 'xid'
               AND (e.details->>'xid')::int = ANY(%(recur_codes)s::int[])))
          AND (%(gpus)s::text[] IS NULL OR e.gpu_uuid = ANY(%(gpus)s::text[]))
    ) s LEFT JOIN repaired USING (gpu_uuid)
    WHERE s.time > {_SINCE}  -- a repair mark restarts every count
), hits AS (
    SELECT p.idx, p.burst_s, s.gpu_uuid, s.time, least(s.last, %(t)s) AS last, s.lines FROM p JOIN signals s
      ON s.time > %(t)s - make_interval(secs => p.reach_s) AND (s.kind = ANY(p.kinds) OR s.code = ANY(p.codes))
      AND (s.after_s IS NULL OR s.after_s <= p.within_s)  -- came back within the window after the remedy
), marked AS (  -- a burst: signals each within burst_s of the one before
    SELECT idx, gpu_uuid, time, last, lines,
           CASE WHEN time - max(last) OVER w <= make_interval(secs => burst_s) THEN 0 ELSE 1 END AS starts
    FROM hits
    WINDOW w AS (PARTITION BY idx, gpu_uuid ORDER BY time, last ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), bursts AS (
    SELECT idx, gpu_uuid, min(time) AS first, max(last) AS last, sum(lines)::bigint AS lines,
           row_number() OVER (PARTITION BY idx, gpu_uuid ORDER BY max(time) DESC) AS n
    FROM (SELECT *, sum(starts) OVER (PARTITION BY idx, gpu_uuid ORDER BY time) AS burst FROM marked) m
    GROUP BY idx, gpu_uuid, burst
)
SELECT idx, gpu_uuid, false, first, last, lines FROM bursts WHERE n <= %(pattern_bursts)s
UNION ALL
SELECT p.idx, s.gpu_uuid, true, max(s.time), max(s.time), sum(s.lines)::bigint FROM p JOIN signals s
  ON s.time > %(t)s - make_interval(secs => p.reach_s) AND (s.kind = ANY(p.cancel_kinds) OR s.code = ANY(p.cancel_codes))
GROUP BY p.idx, s.gpu_uuid
"""


_LOSSES = f"""
WITH {_REPAIRED}, {_REMEDIED}
SELECT gpu_uuid, (array_agg(time ORDER BY time DESC))[1:10], count(*)
FROM gpu_events LEFT JOIN repaired USING (gpu_uuid) LEFT JOIN remedied USING (gpu_uuid)
WHERE kind = 'gpu_lost' AND time > %(t)s - %(escalation)s AND time <= %(t)s AND time > {_SINCE}
  AND time > coalesce(reboot_at, '-infinity')  -- a reboot brought it back
  AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
GROUP BY gpu_uuid
"""


# Events are stored as they arrive; the rollup's minutes only once settled. An event newer than a
# GPU's newest settled minute (or on a GPU with none in the long window) is the newest word on the
# state its sample counters will carry: the event fast path judges a DBE by it at once, and the
# cycle agrees with it until the minute that holds the sample settles.
_EVENT_STATE = """
SELECT e.gpu_uuid,
       (array_agg((e.details->>'total')::bigint ORDER BY e.time DESC) FILTER (WHERE e.kind = 'ecc_dbe'))[1],
       bool_or(e.kind = 'row_remap_failure'),
       (array_agg((e.details->>'pending')::bigint ORDER BY e.time DESC)
          FILTER (WHERE e.kind = 'retirement_pending'))[1]
FROM gpu_events e
WHERE e.kind IN ('ecc_dbe', 'row_remap_failure', 'retirement_pending')
  AND e.time > %(t)s - %(long)s AND e.time <= %(t)s
  AND (%(gpus)s::text[] IS NULL OR e.gpu_uuid = ANY(%(gpus)s::text[]))
  AND e.time > coalesce((SELECT max(g.time) FROM gpu_repairs g WHERE g.gpu_uuid = e.gpu_uuid AND g.time <= %(t)s),
                        '-infinity')  -- nothing before an operator's repair mark (schema/0031)
  AND (e.kind = 'row_remap_failure' OR e.time > coalesce((  -- a DBE's count, or pages pending, a remedy reset;
      SELECT max(r.at) FROM gpu_remedies r  -- a failed remap no remedy repairs
      WHERE r.gpu_uuid = e.gpu_uuid AND r.at <= %(t)s), '-infinity'))
  AND e.time >= coalesce((
      SELECT max(r.bucket) + interval '1 minute' FROM gpu_metrics_1min r
      WHERE r.gpu_uuid = e.gpu_uuid AND r.bucket > %(t)s - %(long)s AND r.bucket <= %(t)s
        AND r.bucket < (SELECT gpu_metrics_1min_settled())), '-infinity')
GROUP BY e.gpu_uuid
"""


_PRECURSORS = """
WITH r AS (
    SELECT m.gpu_uuid, m.bucket, m.bucket > %(t)s - %(recent)s AS recent,
           m.gpu_temp_c_sum / nullif(m.gpu_temp_c_n, 0) AS temp,
           m.power_usage_w_sum / nullif(m.power_usage_w_n, 0) AS power,
           (coalesce(m.clocks_event_reasons_any, 0) & %(hw_thermal)s) <> 0 AS hw_thermal,
           greatest(m.ecc_sbe_volatile_total_max - lag(m.ecc_sbe_volatile_total_max) OVER w, 0) AS d_sbe,
           greatest(m.pcie_replay_total_max - lag(m.pcie_replay_total_max) OVER w, 0) AS d_pcie,
           greatest(coalesce(m.retired_pages_sbe_max, 0) + coalesce(m.remapped_rows_correctable_max, 0)
             - lag(coalesce(m.retired_pages_sbe_max, 0) + coalesce(m.remapped_rows_correctable_max, 0)) OVER w, 0)
             AS d_rows,
           greatest(coalesce(m.nvlink_crc_flit_errors_total_max, 0) + coalesce(m.nvlink_crc_data_errors_total_max, 0)
             - lag(coalesce(m.nvlink_crc_flit_errors_total_max, 0)
                   + coalesce(m.nvlink_crc_data_errors_total_max, 0)) OVER w, 0) AS d_crc
    FROM gpu_metrics_1min m
    WHERE m.bucket > %(t)s - %(trend)s AND m.bucket <= %(t)s
      AND m.bucket < (SELECT gpu_metrics_1min_settled())
      AND (%(gpus)s::text[] IS NULL OR m.gpu_uuid = ANY(%(gpus)s::text[]))
    WINDOW w AS (PARTITION BY m.gpu_uuid ORDER BY m.bucket)
), fit AS (
    SELECT gpu_uuid,
           regr_slope(temp, power) FILTER (WHERE NOT recent AND power > 0) AS slope,
           regr_intercept(temp, power) FILTER (WHERE NOT recent AND power > 0) AS icept,
           min(power) FILTER (WHERE NOT recent AND power > 0) AS p_lo,
           max(power) FILTER (WHERE NOT recent AND power > 0) AS p_hi
    FROM r GROUP BY gpu_uuid
), resid AS (
    -- the recent minutes' temperature above the earlier power-to-temperature line, where the
    -- line was seen (no extrapolation beyond the earlier window's range of power)
    SELECT r.gpu_uuid, percentile_cont(0.5) WITHIN GROUP (ORDER BY r.temp - (f.icept + f.slope * r.power)) AS heat
    FROM r JOIN fit f USING (gpu_uuid)
    WHERE r.recent AND r.power BETWEEN f.p_lo AND f.p_hi AND f.slope IS NOT NULL
    GROUP BY r.gpu_uuid
)
SELECT r.gpu_uuid,
       extract(epoch FROM min(r.bucket)), extract(epoch FROM max(r.bucket)),
       coalesce(sum(d_sbe) FILTER (WHERE recent), 0), coalesce(sum(d_sbe) FILTER (WHERE NOT recent), 0),
       coalesce(sum(d_pcie) FILTER (WHERE recent), 0), coalesce(sum(d_pcie) FILTER (WHERE NOT recent), 0),
       coalesce(sum(d_rows), 0), coalesce(sum(d_crc) FILTER (WHERE recent), 0),
       min(h.heat), count(*) FILTER (WHERE hw_thermal)::float / count(*)
FROM r LEFT JOIN resid h USING (gpu_uuid)
GROUP BY r.gpu_uuid
"""


_REMEDIES = """
SELECT DISTINCT ON (gpu_uuid) gpu_uuid, at, remedy, source, plan_id, actor FROM gpu_remedies
WHERE at <= %(t)s AND at > %(t)s - %(xid)s AND (%(gpus)s::text[] IS NULL OR gpu_uuid = ANY(%(gpus)s::text[]))
ORDER BY gpu_uuid, at DESC, id DESC
"""


def _fetch(conn: SyncConn, query: str, params: dict[str, Any], row: type[_Row]) -> list[_Row]:
    # Never prepared: each run is planned for its own GPUs (one GPU on the event path, a partition
    # share or the fleet in a cycle), where a prepared statement's generic plan would fit none.
    return [row(*values) for values in tuple_rows(conn, query, params, prepare=False)]


def inventory(conn: SyncConn, windows: FeatureWindows) -> list[InventoryRow]:
    """Every GPU the inventory held by `as_of`, with its latest sample's fields."""
    return _fetch(conn, _INVENTORY, windows.params(), InventoryRow)


def rollup_windows(conn: SyncConn, windows: FeatureWindows) -> list[RollupRow]:
    """Per GPU seen in the long window: its newest counters, the short and idle windows, the increments."""
    return _fetch(conn, _ROLLUP, windows.params(), RollupRow)


def xid_counts(conn: SyncConn, windows: FeatureWindows) -> list[XidRow]:
    """Per GPU and XID code seen in the escalation window: how often, recently and in all."""
    return _fetch(conn, _XIDS, windows.params(), XidRow)


def xid_events(conn: SyncConn, windows: FeatureWindows) -> list[XidEventRow]:
    """The newest events of the workflow XIDs per GPU and code, with the kernel log's message."""
    if not windows.workflow_codes:
        return []
    return _fetch(conn, _XID_EVENTS, windows.params(), XidEventRow)


def pattern_signals(conn: SyncConn, windows: FeatureWindows) -> list[PatternRow]:
    """Per pattern rule and GPU: the bursts of what it counts (newest first), and its newest cancelling signal."""
    if not windows.patterns:
        return []
    return _fetch(conn, _PATTERNS, windows.params(), PatternRow)


def remedies(conn: SyncConn, windows: FeatureWindows) -> list[RemedyRow]:
    """Per GPU remedied within the XID window: its newest remedy."""
    return _fetch(conn, _REMEDIES, windows.params(), RemedyRow)


def losses(conn: SyncConn, windows: FeatureWindows) -> list[LossRow]:
    """Per GPU lost in the escalation window: when."""
    return _fetch(conn, _LOSSES, windows.params(), LossRow)


def event_state(conn: SyncConn, windows: FeatureWindows) -> list[EventStateRow]:
    """Per GPU with memory events newer than its newest settled rollup minute: what they reported."""
    return _fetch(conn, _EVENT_STATE, windows.params(), EventStateRow)


def precursors(
    conn: SyncConn,
    as_of: datetime,
    *,
    recent_s: int,
    trend_s: int,
    hw_thermal_mask: int,
    gpus: tuple[str, ...] | None = None,
) -> list[PrecursorRow]:
    """Per GPU seen in the trend window (of `gpus`, None: every GPU): the prediction's raw increments,
    heat residual and slowdown fraction."""
    params = {
        "t": as_of,
        "recent": timedelta(seconds=recent_s),
        "trend": timedelta(seconds=trend_s),
        "hw_thermal": hw_thermal_mask,
        "gpus": None if gpus is None else list(gpus),
    }
    return _fetch(conn, _PRECURSORS, params, PrecursorRow)

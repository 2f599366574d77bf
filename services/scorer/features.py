"""What the rules need to know about every GPU as of a time, computed in SQL over the rollup.

One query per cycle reads the 1-minute rollup for the long window and folds it
per GPU (counter increments use lag(), so a counter reset by a GPU reset is
not a negative rate); one reads XID events; one joins the inventory and the
latest sample. Nothing pulls raw samples into Python: at 10,000 GPUs a cycle
reads ~600k rollup rows inside PostgreSQL and returns 10,000. Only refreshed
minutes are read: those before gpu_metrics_1min_settled() (schema/0014); a
memory event (DBE, failed row remap, pending retirement) newer than a GPU's
newest settled minute counts at once, so a GPU judged on its event and judged
by the cycle a moment later get the same verdict. Every read takes the set of
GPUs judged (None: the fleet). The statements live in
shared.store.verdict_inputs; this module folds their rows.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from gpuhealth.contract.wire_time import wire_time
from shared.store import correlated_inputs, verdict_inputs, verdict_rows
from shared.store.correlated_inputs import Episode
from shared.store.verdict_inputs import FeatureWindows

from .patterns import Burst, pattern_queries
from .rules_config import Rules

Conn = psycopg.Connection[tuple[Any, ...]]


class XidCounts(NamedTuple):
    """One XID code's occurrences on a GPU; plain (recent, total) tuples are accepted too."""

    recent: int  # within the code's time-to-clear
    total: int  # within the escalation window
    in_repeat_window: int | None = None  # within xid_repeats.window_s (None: use `recent`)
    times: tuple[str, ...] = ()  # the newest occurrences, ISO-8601, newest first


XidValue = XidCounts | tuple[int, int]


class XidEvent(NamedTuple):
    """One occurrence of a workflow XID: when, from which source, and the kernel log's text if it had any."""

    time: datetime
    source: str
    message: str | None = None


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
    driver_version: str | None = None  # from the inventory: which NVLink message format the driver writes
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
    # workflow XIDs (the catalogue's `workflow` column): code -> their newest events, newest first
    xid_events: dict[int, tuple[XidEvent, ...]] = field(default_factory=dict)
    # pattern rules, by name: the bursts of what each counts (newest first), its newest cancelling signal
    pattern_bursts: dict[str, tuple[Burst, ...]] = field(default_factory=dict)
    pattern_cancelled: dict[str, datetime] = field(default_factory=dict)
    # the newest remedy within the XID window (a reset, a reboot): what it resolved is not counted
    remedy: dict[str, Any] | None = None
    # what this GPU showed together with others: a job's crash, a fault of its host or rack
    episodes: list[Episode] = field(default_factory=list)


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def feature_windows(as_of: datetime, rules: Rules, only: Collection[str] | None = None) -> FeatureWindows:
    """The windows the rules look back over from `as_of`, over the GPUs `only` (None: every GPU)."""
    w = rules.windows
    patterns, kinds, reach = pattern_queries(rules)
    return FeatureWindows(
        as_of=as_of,
        short_s=w.short_s,
        long_s=w.long_s,
        idle_s=rules.idle.for_s,
        escalation_s=w.escalation_s,
        repeat_s=rules.xid_repeats.window_s,
        xid_s=w.xid_s,
        default_slowdown_c=rules.thermal.default_slowdown_c,
        xid_clear_s={code: rules.xid_clear_s(code) for code in rules.xid},
        workflow_codes=tuple(sorted(code for code, entry in rules.xid.items() if entry.workflow)),
        workflow_s=max(w.xid_s, rules.xid_repeats.window_s, *(rules.xid_clear_s(c) for c in rules.xid)),
        events_per_code=rules.workflows.events_per_code,
        patterns=patterns,
        pattern_kinds=kinds,
        pattern_reach_s=reach,
        gpus=None if only is None else tuple(sorted(only)),
        reset_codes=remedied_by(rules, "reset_gpu"),
        reboot_codes=remedied_by(rules, "reboot_node"),
        recur_codes=tuple(
            c
            for c, e in sorted(rules.xid.items())
            if e.action in ("reset_gpu", "reboot_node") and e.severity != "info"
        ),
    )


def remedied_by(rules: Rules, rung: str) -> tuple[int, ...]:
    """The XID codes a remedy resolves beyond the rungs below it, by NVIDIA's catalogue (the row's action):
    a reset those whose action is restart_workload or reset_gpu; a reboot also reboot_node's."""
    actions = {"reset_gpu": ("restart_workload", "reset_gpu"), "reboot_node": ("reboot_node",)}[rung]
    return tuple(code for code, entry in sorted(rules.xid.items()) if entry.action in actions)


def read_features(
    conn: Conn, as_of: datetime, rules: Rules, only: Collection[str] | None = None
) -> dict[str, GpuFeatures]:
    """The features of the GPUs `only` (None: every GPU in the inventory) as of `as_of`."""
    windows = feature_windows(as_of, rules, only)
    gpus: dict[str, GpuFeatures] = {}
    for a in verdict_inputs.inventory(conn, windows):
        gpus[a.gpu_uuid] = GpuFeatures(
            gpu_uuid=a.gpu_uuid,
            hostname=a.hostname,
            model=a.model,
            last_time=a.last_time,
            slowdown_c=float(a.slowdown_c),
            power_limit_w=a.power_limit_w,
            fb_total_mib=a.fb_total_mib,
            pod=a.pod,
            fb_used_mib=a.fb_used_mib,
            remap_pending=_int(a.row_remap_pending),
            recovery_action=a.recovery_action,
            driver_version=a.driver_version,
        )
    for r in verdict_inputs.rollup_windows(conn, windows):
        g = gpus.get(r.gpu_uuid)
        if g is None:
            continue
        g.dbe_volatile, g.retired_pages = _int(r.dbe_volatile), _int(r.retired_pages)
        g.retired_pending, g.remap_failure = _int(r.retired_pending), _int(r.remap_failure)
        g.remapped_uncorrectable = _int(r.remapped_uncorrectable)
        g.temp_max, g.power_avg = r.temp_max, r.power_avg
        g.reasons_any = _int(r.reasons_any)
        g.util_max_idle_window, g.idle_minutes = r.util_max_idle_window, _int(r.idle_minutes)
        g.sbe_new, g.pcie_new, g.dbe_new = _int(r.sbe_new), _int(r.pcie_new), _int(r.dbe_new)
        g.nvlink_crc_new, g.nvlink_replay_recovery_new = (
            _int(r.nvlink_crc_new),
            _int(r.nvlink_replay_recovery_new),
        )
        g.minutes_long = _int(r.minutes_long)
        g.span_long_s = float(r.span_long_s) if r.span_long_s is not None else None
    for x in verdict_inputs.xid_counts(conn, windows):
        if x.gpu_uuid in gpus:
            stamps = tuple(wire_time(t) for t in x.times)
            gpus[x.gpu_uuid].xids[int(x.code)] = XidCounts(
                int(x.recent), int(x.total), int(x.in_repeat_window), stamps
            )
    for e in verdict_inputs.xid_events(conn, windows):
        if e.gpu_uuid in gpus:
            found = gpus[e.gpu_uuid].xid_events
            found[e.code] = (*found.get(e.code, ()), XidEvent(e.time, e.source, e.message))
    for row in verdict_inputs.pattern_signals(conn, windows):
        if row.gpu_uuid in gpus:
            g, name = gpus[row.gpu_uuid], rules.patterns[row.idx].name
            if row.cancel:
                g.pattern_cancelled[name] = row.last
            else:
                g.pattern_bursts[name] = (
                    *g.pattern_bursts.get(name, ()),
                    Burst(row.first, row.last, row.lines),
                )
    _correlate(conn, as_of, rules, gpus, only)
    for loss in verdict_inputs.losses(conn, windows):
        if loss.gpu_uuid in gpus:
            gpus[loss.gpu_uuid].lost_times = tuple(wire_time(t) for t in loss.times)
    for remedy in verdict_inputs.remedies(conn, windows):
        if (g := gpus.get(remedy.gpu_uuid)) is not None:
            g.remedy = resolved_by(remedy)
    for m in verdict_inputs.event_state(conn, windows):
        if (g := gpus.get(m.gpu_uuid)) is not None:
            g.dbe_volatile = max(g.dbe_volatile, _int(m.dbe_volatile))
            g.remap_failure = max(g.remap_failure, int(bool(m.remap_failure)))
            g.retired_pending = max(g.retired_pending, _int(m.retired_pending))
    return gpus


def _correlate(
    conn: Conn, as_of: datetime, rules: Rules, gpus: dict[str, GpuFeatures], only: Collection[str] | None
) -> None:
    """Each GPU's part in what several GPUs showed together (shared.store.correlated_inputs)."""
    c = rules.correlation
    app = [code for code, e in rules.xid.items() if e.xid_class == "application"]
    hardware = [code for code, e in rules.xid.items() if e.xid_class == "hardware" and e.severity != "info"]
    app_reach = max((rules.xid_clear_s(code) for code in app), default=rules.windows.xid_s)
    found = correlated_inputs.job_crashes(
        conn, as_of, reach_s=app_reach, window_s=c.job_window_s, min_gpus=c.job_min_gpus, codes=app, gpus=only
    )
    found += correlated_inputs.place_faults(
        conn,
        as_of,
        reach_s=rules.windows.xid_s,
        window_s=c.place_window_s,
        min_gpus=c.place_min_gpus,
        codes=hardware,
        gpus=only,
    )
    for episode in found:
        for uuid in episode.gpus:
            if uuid in gpus:
                gpus[uuid].episodes.append(episode)


def resolved_by(r: verdict_rows.RemedyRow) -> dict[str, Any]:
    """A remedy as the XID verdict's evidence names it: what it was, when, and by whom."""
    by = {
        "remediator": f"plan {r.plan_id}",
        "operator": f"operator {r.actor}",
        "gpu": "the GPU (its recovery action back to none)",
    }.get(r.source, r.source)
    return {
        "remedy": r.remedy,
        "at": wire_time(r.at),
        "by": by,
        "resolved": f"{r.remedy} by {by}: the XIDs it resolves are not counted from before it",
    }

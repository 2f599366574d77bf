"""shared.store.verdict_inputs against a migrated schema: the scorer reads settled rollup minutes only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import verdict_inputs
from shared.store.verdict_inputs import FeatureWindows
from tests.helpers.store_rows import T0, add_gpu, add_latest, gpu

AS_OF = T0 + timedelta(minutes=30)
WINDOWS = FeatureWindows(
    as_of=AS_OF,
    short_s=900,
    long_s=3600,
    idle_s=600,
    escalation_s=86400,
    repeat_s=3600,
    xid_s=86400,
    default_slowdown_c=87.0,
    xid_clear_s={48: 3600, 79: 600},
)


@pytest.fixture
def conn(migrated: DatabaseSettings) -> Iterator[psycopg.Connection[Any]]:
    """GPU 0 with 30 rollup minutes before AS_OF (its SBE counter +2 a minute), two XIDs and a loss."""
    with connect(migrated) as c:
        add_gpu(c, 0, host="node-a")
        add_latest(c, 0, at=AS_OF - timedelta(seconds=5))
        for m in range(30):
            c.execute(
                "INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n,"
                " gpu_temp_c_max, power_usage_w_sum, power_usage_w_n, ecc_sbe_volatile_total_max)"
                " VALUES (%s, %s, 6, 360, 6, %s, 1800, 6, %s)",
                (T0 + timedelta(minutes=m), gpu(0), 60 + m, 2 * m),
            )
        for minutes_ago, kind, details in [
            (50, "xid", {"xid": 48}),
            (5, "xid", {"xid": 79}),
            (20, "gpu_lost", {}),
        ]:
            c.execute(
                "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
                " VALUES (%s, %s, %s, 'node-a', 'mock', 'test', %s)",
                (AS_OF - timedelta(minutes=minutes_ago), gpu(0), kind, Jsonb(details)),
            )
        c.commit()
        yield c


def test_the_windows_fold_the_rollup(conn: psycopg.Connection[Any]) -> None:
    (row,) = verdict_inputs.rollup_windows(conn, WINDOWS)
    assert (row.gpu_uuid, row.minutes_long, row.sbe_new, row.span_long_s) == (gpu(0), 30, 58, 29 * 60)
    assert row.temp_max == 89  # within the short window (the newest 15 minutes)
    (asset,) = verdict_inputs.inventory(conn, WINDOWS)
    assert (asset.hostname, asset.last_time, asset.slowdown_c) == (
        "node-a",
        AS_OF - timedelta(seconds=5),
        87.0,
    )
    xids = {x.code: (x.recent, x.total) for x in verdict_inputs.xid_counts(conn, WINDOWS)}
    assert xids == {48: (1, 1), 79: (1, 1)}
    (loss,) = verdict_inputs.losses(conn, WINDOWS)
    assert (loss.gpu_uuid, loss.losses, loss.times) == (gpu(0), 1, [AS_OF - timedelta(minutes=20)])
    (pre,) = verdict_inputs.precursors(conn, AS_OF, recent_s=600, trend_s=7200, hw_thermal_mask=0x40)
    assert (pre.gpu_uuid, pre.sbe_recent + pre.sbe_earlier, pre.hw_thermal_fraction) == (gpu(0), 58, 0.0)


def test_minutes_the_sink_has_not_settled_are_not_read(conn: psycopg.Connection[Any]) -> None:
    # The sink notes a minute it wrote but has not refreshed yet; readers stop before the oldest note.
    conn.execute("INSERT INTO gpu_metrics_1min_pending (bucket) VALUES (%s)", (T0 + timedelta(minutes=20),))
    conn.commit()
    (row,) = verdict_inputs.rollup_windows(conn, WINDOWS)
    assert (row.minutes_long, row.sbe_new, row.temp_max) == (20, 38, 79)
    (pre,) = verdict_inputs.precursors(conn, AS_OF, recent_s=600, trend_s=7200, hw_thermal_mask=0x40)
    assert pre.last_s == (T0 + timedelta(minutes=19)).timestamp()
    conn.execute("DELETE FROM gpu_latest")
    conn.commit()
    (asset,) = verdict_inputs.inventory(conn, WINDOWS)  # no latest sample: the newest settled minute's end
    assert asset.last_time == T0 + timedelta(minutes=19, seconds=59)


def test_workflow_xids_come_with_their_messages_newest_first_and_bounded(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("UPDATE gpu_assets SET driver_version = '570.124.06' WHERE gpu_uuid = %s", (gpu(0),))
    line = "NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x025525c6 0x00000000)"
    for k in range(5):
        details = {"xid": 149, "origin": "kmsg", "kernel_message": line} if k % 2 else {"xid": 149}
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, 'xid', 'node-a', %s, 'test', %s)",
            (
                AS_OF - timedelta(minutes=k + 1, seconds=30),
                gpu(0),
                "kmsg" if k % 2 else "dcgm",
                Jsonb(details),
            ),
        )
    conn.commit()
    windows = replace(WINDOWS, workflow_codes=(48, 149), events_per_code=3)
    found = verdict_inputs.xid_events(conn, windows)
    assert [(e.code, e.source, e.message) for e in found] == [
        (48, "mock", None),  # no message: it did not come from the kernel log
        (149, "dcgm", None),
        (149, "kmsg", line),
        (149, "dcgm", None),
    ]
    assert [e.time for e in found[1:]] == [AS_OF - timedelta(minutes=m, seconds=30) for m in (1, 2, 3)]
    assert verdict_inputs.xid_events(conn, WINDOWS) == []  # no workflow codes asked for: nothing read
    (asset,) = verdict_inputs.inventory(conn, WINDOWS)
    assert asset.driver_version == "570.124.06"


def test_pattern_signals_fold_into_bursts_in_the_database(conn: psycopg.Connection[Any]) -> None:
    def event(seconds_ago: float, kind: str, details: dict[str, Any]) -> None:
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, %s, 'node-a', 'mock', 'test', %s)",
            (AS_OF - timedelta(seconds=seconds_ago), gpu(0), kind, Jsonb(details)),
        )

    for i in range(2000):  # a flood: 2,000 XID 95s within 20 seconds, then one more an hour before
        event(100 + i * 0.01, "xid", {"xid": 95})
    event(3700, "xid", {"xid": 95})
    event(900, "gpu_back", {})
    for t, state in [(1500, "unhealthy"), (1000, "healthy"), (400, "unhealthy")]:  # one remediation took
        conn.execute(
            "INSERT INTO gpu_health (time, gpu_uuid, subsystem, state) VALUES (%s, %s, 'xid', %s)",
            (AS_OF - timedelta(seconds=t), gpu(0), state),
        )
    # the remediator's plans: one live that started (counted), one dry-run and one held (not counted)
    for seconds_ago, dry_run, held_for in [(800, False, None), (700, True, None), (600, False, "approval")]:
        at = AS_OF - timedelta(seconds=seconds_ago)
        conn.execute(
            "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, held_for, dry_run,"
            " decision_key, created_at, updated_at, next_at) VALUES ('node-a', %s, 'reset_gpu', 'xid_79',"
            " '{cordon}', %s, %s, %s, %s, %s, %s, %s)",
            ([gpu(0)], "held" if held_for else "done", held_for, dry_run, f"k{seconds_ago}", at, at, at),
        )
    conn.commit()
    patterns = (
        {"idx": 0, "kinds": [], "codes": [95], "reach_s": 7200.0, "burst_s": 60.0,
         "cancel_kinds": ["gpu_back"], "cancel_codes": []},
        {"idx": 1, "kinds": ["gpu_back", "recovered"], "codes": [], "reach_s": 7200.0, "burst_s": 0.0,
         "cancel_kinds": [], "cancel_codes": []},
        {"idx": 2, "kinds": ["changed"], "codes": [], "reach_s": 7200.0, "burst_s": 0.0,
         "cancel_kinds": [], "cancel_codes": []},
        {"idx": 3, "kinds": ["remediated"], "codes": [], "reach_s": 7200.0, "burst_s": 0.0,
         "cancel_kinds": [], "cancel_codes": []},
    )  # fmt: skip
    windows = replace(WINDOWS, patterns=patterns, pattern_kinds=("gpu_back", "xid"), pattern_reach_s=7200.0)
    rows = verdict_inputs.pattern_signals(conn, windows)
    flood = sorted((r.first, r.last, r.lines) for r in rows if r.idx == 0 and not r.cancel)
    assert flood == [
        (AS_OF - timedelta(seconds=3700),) * 2 + (1,),
        (AS_OF - timedelta(seconds=100 + 1999 * 0.01), AS_OF - timedelta(seconds=100), 2000),
    ]
    (cancel,) = [r for r in rows if r.idx == 0 and r.cancel]
    assert cancel.last == AS_OF - timedelta(seconds=900)
    remediations = sorted(r.last for r in rows if r.idx == 1 and not r.cancel)
    assert remediations == [AS_OF - timedelta(seconds=1000), AS_OF - timedelta(seconds=900)]
    changes = sorted(r.last for r in rows if r.idx == 2 and not r.cancel)
    assert changes == [AS_OF - timedelta(seconds=t) for t in (1500, 1000, 400)]
    carried_out = [(r.gpu_uuid, r.last) for r in rows if r.idx == 3]
    assert carried_out == [(gpu(0), AS_OF - timedelta(seconds=800))]
    # an operator marks the GPU repaired: nothing before the mark counts any more
    conn.execute(
        "INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by) VALUES (%s, %s, 'repaired', 'oncall')",
        (gpu(0), AS_OF - timedelta(seconds=950)),
    )
    conn.commit()
    after = verdict_inputs.pattern_signals(conn, windows)
    assert sorted((r.idx, r.cancel, r.last) for r in after) == [
        (0, False, AS_OF - timedelta(seconds=100)),
        (0, True, AS_OF - timedelta(seconds=900)),
        (1, False, AS_OF - timedelta(seconds=900)),
        (2, False, AS_OF - timedelta(seconds=400)),
        (3, False, AS_OF - timedelta(seconds=800)),
    ]
    # the XID 48 fifty minutes ago and the XID 95 an hour ago no longer count; the 79 and the flood do
    assert {x.code: x.total for x in verdict_inputs.xid_counts(conn, WINDOWS)} == {79: 1, 95: 2000}


def test_a_folded_flood_is_stored_once_and_counts_as_its_lines(conn: psycopg.Connection[Any]) -> None:
    """The collector's folds (services/collector/xid_fold.py): the first line, then its count; the sink
    keeps the highest count whichever path, order or replay brings it; the scorer counts the lines."""
    from gpuhealth.contract.wire_time import wire_time
    from shared.contract.models import EventKind, GpuEvent, Source
    from shared.store import events
    from shared.store.events import EVENTS_STAGE, event_row

    def xid(seconds_ago: float, count: int = 1, last_ago: float | None = None) -> GpuEvent:
        details: dict[str, Any] = {"xid": 95}
        if count > 1:
            details |= {"count": count, "last": wire_time(AS_OF - timedelta(seconds=last_ago or seconds_ago))}
        at = AS_OF - timedelta(seconds=seconds_ago)
        return GpuEvent(time=at, kind=EventKind.XID, gpu_uuid=gpu(0), hostname="node-a",
                        source=Source.MOCK, collector_id="test", details=details)  # fmt: skip

    # the scorer's fast path: a fold's first line, its count, then the first line replayed
    events.insert_events(conn, [xid(130), xid(130, 1500, 121)])
    events.insert_events(conn, [xid(130)])
    # the sink's batch: the next fold's first line and its count together, and an older revision after
    with conn.cursor() as cur:
        cur.execute(EVENTS_STAGE.create())
        EVENTS_STAGE.copy_rows(cur, map(event_row, [xid(120), xid(120, 500, 110), xid(120, 300, 115)]))
        assert events.insert_staged(cur) == 1
        EVENTS_STAGE.copy_rows(cur, map(event_row, [xid(130, 1400, 122)]))  # a stale revision: no change
        assert events.insert_staged(cur) == 0
    conn.commit()
    stored = conn.execute(
        "SELECT time, details->>'count', details->>'last' FROM gpu_events WHERE details->>'xid' = '95'"
        " ORDER BY time"
    ).fetchall()
    assert [(AS_OF - t).total_seconds() for t, _, _ in stored] == [130, 120]
    assert [n for _, n, _ in stored] == ["1500", "500"]
    assert {x.code: (x.recent, x.total) for x in verdict_inputs.xid_counts(conn, WINDOWS)}[95] == (2000, 2000)
    patterns = (
        {"idx": 0, "kinds": [], "codes": [95], "reach_s": 7200.0, "burst_s": 60.0,
         "cancel_kinds": [], "cancel_codes": []},
        {"idx": 1, "kinds": [], "codes": [95], "reach_s": 7200.0, "burst_s": 0.5,
         "cancel_kinds": [], "cancel_codes": []},
    )  # fmt: skip
    windows = replace(WINDOWS, patterns=patterns, pattern_kinds=("xid",), pattern_reach_s=7200.0)
    rows = sorted((r.idx, r.first, r.last, r.lines) for r in verdict_inputs.pattern_signals(conn, windows))
    # 60 s bursts: both folds (1 s apart) are one burst of 2,000 lines; 0.5 s bursts: two, as their lines
    ago = [AS_OF - timedelta(seconds=s) for s in (130, 121, 120, 110)]
    assert rows == [(0, ago[0], ago[3], 2000), (1, ago[0], ago[1], 1500), (1, ago[2], ago[3], 500)]

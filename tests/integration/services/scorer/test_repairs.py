"""The way back to healthy in the scorer: after a repair mark the findings resolve, the alert with them,
the repeat counters start again, and the verdict history stays as it was."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from services.scorer.cycle import run_cycle
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import GpuEvent, parse_event
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

UUID = gpu_uuid(0)


def xid(code: int, seconds: float) -> GpuEvent:
    return parse_event(json.dumps({
        "schema_version": 1, "time": (T0 + timedelta(seconds=seconds)).isoformat(), "kind": "xid",
        "gpu_uuid": UUID, "hostname": "node-00", "source": "dcgm", "collector_id": "itest",
        "details": {"xid": code},
    }))  # fmt: skip


def write(db: DatabaseSettings, until_s: int, events: list[GpuEvent], done: dict[str, int]) -> None:
    """Samples every 10 s up to `until_s`, and `events`: the stream as the sink would have stored it."""
    rows = [stage_row(json.dumps(sample(i, gpus=1))) for i in range(done["samples"], until_s // 10)]
    done["samples"] = until_s // 10
    done["offset"] += len(rows) + len(events)
    writer = BatchWriter(db, group="itest-32-way-back", connections=1)
    try:
        writer.write(Batch(rows=rows, events=events, next_offsets={("t", 0): done["offset"]}))
    finally:
        writer.close()


def status(conn: Any) -> tuple[str, str]:
    found = conn.execute("SELECT state, action FROM gpu_status WHERE gpu_uuid = %s", (UUID,)).fetchone()
    return (str(found[0]), str(found[1]))


def test_a_repair_mark_resolves_the_findings_and_restarts_the_counts(migrated: DatabaseSettings) -> None:
    rules, done = load_rules(), {"samples": 0, "offset": 0}
    write(migrated, 1000, [xid(48, 60), xid(48, 900)], done)
    with connect(migrated) as conn:
        run_cycle(conn, T0 + timedelta(seconds=1000), rules, predictions={})
        assert status(conn) == ("unhealthy", "reboot_node")  # the DBE again: one rung up
        assert conn.execute("SELECT state FROM gpu_alerts").fetchall() == [("open",)]
        conn.execute(
            "INSERT INTO gpu_repairs (gpu_uuid, time, kind, marked_by, note)"
            " VALUES (%s, %s, 'repaired', 'oncall', 'HBM replaced')", (UUID, T0 + timedelta(seconds=1100)),
        )  # fmt: skip
        conn.commit()
    write(migrated, 1200, [], done)
    with connect(migrated) as conn:
        run_cycle(conn, T0 + timedelta(seconds=1200), rules, predictions={})
        assert status(conn) == ("healthy", "none")
        assert conn.execute("SELECT state FROM gpu_alerts").fetchall() == [("resolved",)]
        history = conn.execute(
            "SELECT state, rule FROM gpu_health WHERE gpu_uuid = %s AND subsystem = 'xid' ORDER BY time",
            (UUID,),
        ).fetchall()
        assert history == [("unhealthy", "xid_48"), ("healthy", None)]  # the record stays queryable
    write(migrated, 1400, [xid(48, 1300)], done)
    with connect(migrated) as conn:
        run_cycle(conn, T0 + timedelta(seconds=1400), rules, predictions={})
        # counted again from the mark: a reset, not a reboot
        assert status(conn) == ("unhealthy", "reset_gpu")
        found: Any = conn.execute(
            "SELECT evidence FROM gpu_health_current WHERE gpu_uuid = %s AND subsystem = 'xid'", (UUID,)
        ).fetchone()
        assert found is not None
        assert found[0]["count_30d"] == 1

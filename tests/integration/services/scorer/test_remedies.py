"""A remedy resolves what it remedies (#40): the scorer counts no XID a reset or a reboot covers from before
it, the verdict names the remedy, the history keeps the finding, and the fault seen again after the remedy
is a recurrence that escalates. The samples and events go through the sink's own writer, so the GPU's own
word (NVML's recovery action back to none) becomes a remedy where the sink moves its latest sample on."""

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
RULES = load_rules()


def xid(code: int, seconds: float) -> GpuEvent:
    return parse_event(json.dumps({
        "schema_version": 1, "time": (T0 + timedelta(seconds=seconds)).isoformat(), "kind": "xid",
        "gpu_uuid": UUID, "hostname": "node-00", "source": "dcgm", "collector_id": "itest",
        "details": {"xid": code},
    }))  # fmt: skip


class Stream:
    """Samples every 10 s and events, written as the sink writes them, a batch at a time."""

    def __init__(self, db: DatabaseSettings) -> None:
        self.db, self.samples, self.offset = db, 0, 0

    def until(self, seconds: int, events: tuple[GpuEvent, ...] = (), **fields: Any) -> None:
        rows = [
            stage_row(json.dumps(sample(i, gpus=1, **fields))) for i in range(self.samples, seconds // 10)
        ]
        self.samples = seconds // 10
        self.offset += len(rows) + len(events)
        writer = BatchWriter(self.db, group="itest-40-remedies", connections=1)
        try:
            writer.write(Batch(rows=rows, events=list(events), next_offsets={("t", 0): self.offset}))
        finally:
            writer.close()


def judged(db: DatabaseSettings, seconds: int) -> dict[str, Any]:
    """A scoring cycle as of `seconds`; each subsystem's (state, rule, evidence) after it, and under
    "status" the GPU's (state, action)."""
    with connect(db) as conn:
        run_cycle(conn, T0 + timedelta(seconds=seconds), RULES, predictions={})
        found = conn.execute(
            "SELECT subsystem, state, rule, evidence FROM gpu_health_current WHERE gpu_uuid = %s", (UUID,)
        ).fetchall()
        status = conn.execute("SELECT state, action FROM gpu_status WHERE gpu_uuid = %s", (UUID,)).fetchone()
    return {**{str(s): (state, rule, evidence) for s, state, rule, evidence in found}, "status": status}


def test_the_gpus_own_word_that_it_recovered_resolves_the_xid_and_its_return_escalates(
    migrated: DatabaseSettings,
) -> None:
    stream = Stream(migrated)
    stream.until(60, (xid(119, 30),), gpu_recovery_action=1)  # NVML: GPU_RESET
    first = judged(migrated, 60)
    assert (first["xid"][:2], first["status"]) == (("unhealthy", "xid_119"), ("unhealthy", "reset_gpu"))
    stream.until(90, gpu_recovery_action=0)  # reset (by whom, the GPU does not say): NONE again
    with connect(migrated) as conn:
        remedies = conn.execute("SELECT gpu_uuid, remedy, source, plan_id, note FROM gpu_remedies").fetchall()
    assert remedies == [(UUID, "reset_gpu", "gpu", None, "NVML recovery action 1 -> 0 (none)")]
    reset = judged(migrated, 90)
    state, rule, evidence = reset["xid"]
    assert (state, rule, reset["status"]) == ("healthy", None, ("healthy", "none"))
    assert evidence["resolved_by"]["by"] == "the GPU (its recovery action back to none)"
    with connect(migrated) as conn:
        history = conn.execute(
            "SELECT state, rule FROM gpu_health WHERE gpu_uuid = %s AND subsystem = 'xid' ORDER BY time",
            (UUID,),
        ).fetchall()
    assert history == [("unhealthy", "xid_119"), ("healthy", None)]  # the record stays as it was
    stream.until(120, (xid(119, 100),), gpu_recovery_action=0)  # back within a day of the reset
    now = judged(migrated, 120)
    assert now["xid"][:2] == ("unhealthy", "xid_119")
    assert now["xid"][2]["count_30d"] == 1  # counted from the reset: one
    assert now["history"][:2] == ("unhealthy", "pattern_recurred_after_remedy")
    assert now["status"] == ("unhealthy", "reboot_node")  # the next rung


def test_a_reset_leaves_what_only_a_reboot_ends_and_a_reboot_by_hand_ends_it(
    migrated: DatabaseSettings,
) -> None:
    stream = Stream(migrated)
    stream.until(60, (xid(79, 20), xid(119, 30)))
    first = judged(migrated, 60)
    assert (first["xid"][:2], first["status"]) == (("unhealthy", "xid_79"), ("unhealthy", "reboot_node"))

    def by_hand(remedy: str, seconds: int) -> None:
        with connect(migrated) as conn:  # as the API records it (POST /api/v1/gpus/{uuid}/remedies)
            conn.execute("SELECT * FROM record_gpu_remedy(%s, %s, 'oncall', 'by hand')", (UUID, remedy))
            conn.execute(  # on the simulated clock
                "UPDATE gpu_remedies SET at = %s WHERE id = (SELECT max(id) FROM gpu_remedies)",
                (T0 + timedelta(seconds=seconds),),
            )
            conn.commit()

    by_hand("reset_gpu", 65)
    stream.until(70)
    after_reset = judged(migrated, 70)
    assert after_reset["xid"][:2] == ("unhealthy", "xid_79")  # a reset does not reach a fall off the bus
    assert after_reset["status"] == ("unhealthy", "reboot_node")
    assert after_reset["xid"][2]["resolved_by"]["by"] == "operator oncall"
    by_hand("reboot_node", 75)
    stream.until(80)
    assert judged(migrated, 80)["status"] == ("healthy", "none")
    stream.until(100, (xid(79, 90),))
    again = judged(migrated, 100)
    assert (again["history"][:2], again["status"]) == (
        ("unhealthy", "pattern_recurred_after_reboot"),
        ("unhealthy", "inspect"),
    )

"""Workflow XIDs through the sink and the database to the verdict: the kernel message decides where it can."""

from __future__ import annotations

import json
from datetime import timedelta

from services.scorer.features import read_features
from services.scorer.rules import evaluate
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import GpuEvent, parse_event
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

LINK_DOWN_V1 = (
    "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000)"
)
BER_V1 = "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000)"


def xid_event(i: int, code: int, seconds: float, message: str | None) -> GpuEvent:
    details: dict[str, object] = {"xid": code}
    if message is not None:
        details |= {"origin": "kmsg", "pci_bus_id": "00000000:3B:00.0", "kernel_message": message}
    return parse_event(json.dumps({
        "schema_version": 1, "time": (T0 + timedelta(seconds=seconds)).isoformat(), "kind": "xid",
        "gpu_uuid": gpu_uuid(i), "hostname": "gpu-node-00", "source": "dcgm", "collector_id": "itest",
        "details": details,
    }))  # fmt: skip


def test_nvlink5_and_a_dbe_workflow_judged_from_what_the_database_holds(migrated: DatabaseSettings) -> None:
    gpus = 4
    rows = [sample(i, gpus=gpus, model="NVIDIA B200", driver_version="570.124.06") for i in range(gpus)]
    events = [
        xid_event(0, 149, 1, LINK_DOWN_V1),  # decoded: link fatal, reset
        xid_event(1, 149, 1, BER_V1),  # decoded: a bit-error-rate event NVIDIA ignores
        xid_event(2, 149, 1, None),  # dcgm only: no message to decode, the safe action
        xid_event(3, 48, 1, None),
        xid_event(3, 64, 1.5, None),  # the DBE's row could not be remapped
    ]
    writer = BatchWriter(migrated, group="itest-32", connections=1)
    try:
        writer.write(
            Batch(rows=[stage_row(json.dumps(r)) for r in rows], events=events, next_offsets={("t", 0): 9})
        )
    finally:
        writer.close()
    rules, as_of = load_rules(), T0 + timedelta(seconds=5)
    with connect(migrated) as conn:
        features = read_features(conn, as_of, rules)
    assert features[gpu_uuid(0)].driver_version == "570.124.06"
    verdicts = {i: evaluate(features[gpu_uuid(i)], rules, as_of)["xid"] for i in range(gpus)}
    decoded = verdicts[0].evidence["decoded"][0]
    assert (verdicts[0].state, verdicts[0].action) == ("unhealthy", "reset_gpu")
    assert (decoded["generation"], decoded["subcode"]) == (
        "v1 (before R575)",
        "NETIR_LINK_EVT/NETIR_LINK_DOWN",
    )
    assert verdicts[1].state == "healthy"
    assert (verdicts[2].state, verdicts[2].action) == ("unhealthy", "reset_gpu")
    assert verdicts[2].evidence["decode"].startswith("not possible: no kernel log message (seen by dcgm)")
    assert (verdicts[3].rule, verdicts[3].action) == ("xid_48", "send_for_repair")

"""The driver's recovery action and PCIe link fields from a collector sample to the scorer's verdict."""

from __future__ import annotations

import json
from datetime import timedelta

from services.scorer.features import read_features
from services.scorer.rules import evaluate, overall
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings


def test_a_sample_carrying_a_recovery_action_makes_the_scorer_recommend_it(
    migrated: DatabaseSettings,
) -> None:
    rows = [
        sample(0, gpus=2, gpu_recovery_action=2, pcie_link_gen=4, pcie_link_gen_max=5,
               pcie_link_width=8, pcie_link_width_max=16),
        sample(1, gpus=2, gpu_recovery_action=0),
    ]  # fmt: skip
    writer = BatchWriter(migrated, group="itest-17", connections=1)
    try:
        writer.write(Batch(rows=[stage_row(json.dumps(r)) for r in rows], next_offsets={("t", 0): 2}))
    finally:
        writer.close()
    with connect(migrated) as conn:
        stored = conn.execute(
            "SELECT gpu_uuid, gpu_recovery_action, pcie_link_gen, pcie_link_width, pcie_link_width_max"
            " FROM gpu_metrics ORDER BY gpu_uuid"
        ).fetchall()
        assert stored == [(gpu_uuid(0), 2, 4, 8, 16), (gpu_uuid(1), 0, None, None, None)]
        latest = conn.execute(
            "SELECT gpu_recovery_action FROM gpu_latest WHERE gpu_uuid = %s", (gpu_uuid(0),)
        )
        assert latest.fetchone() == (2,)
        rules = load_rules()
        features = read_features(conn, T0 + timedelta(seconds=5), rules)
    assert features[gpu_uuid(0)].recovery_action == 2
    rebooting = evaluate(features[gpu_uuid(0)], rules, T0 + timedelta(seconds=5))
    assert overall(rebooting) == ("unhealthy", "reboot_node")
    assert rebooting["xid"].rule == "driver_recovery_node_reboot"
    assert evaluate(features[gpu_uuid(1)], rules, T0 + timedelta(seconds=5))["xid"].state == "healthy"

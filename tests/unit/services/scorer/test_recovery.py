"""The driver's GPU recovery action (NVML, via the latest sample) in the scorer's verdict."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.scorer.features import GpuFeatures
from services.scorer.rules import evaluate, overall
from services.scorer.rules_config import load_rules

RULES = load_rules()
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
GPU = GpuFeatures(
    gpu_uuid="GPU-1", hostname="n1", model="NVIDIA H100 80GB HBM3", last_time=NOW - timedelta(seconds=5),
    slowdown_c=89, power_limit_w=700, fb_total_mib=81559, temp_max=60, minutes_long=60,
)  # fmt: skip


@pytest.mark.parametrize(
    ("code", "state", "rule", "action"),
    [
        (1, "unhealthy", "driver_recovery_gpu_reset", "reset_gpu"),
        (2, "unhealthy", "driver_recovery_node_reboot", "reboot_node"),
        (3, "degraded", "driver_recovery_drain_p2p", "restart_workload"),
        (4, "degraded", "driver_recovery_drain_and_reset", "reset_gpu"),
        (5, "degraded", "driver_recovery_recover_imex_domain", "inspect"),
        (6, "unhealthy", "driver_recovery_bus_reset", "reset_gpu"),
        (7, "unhealthy", "driver_recovery_system_reboot", "reboot_node"),
        (9, "degraded", "driver_recovery_unknown_9", "inspect"),
    ],
)
def test_the_recovery_action_decides_the_recommended_action(
    code: int, state: str, rule: str, action: str
) -> None:
    verdicts = evaluate(replace(GPU, recovery_action=code), RULES, NOW)
    xid = verdicts["xid"]
    assert (xid.state, xid.rule, xid.action) == (state, rule, action)
    assert xid.evidence == {"gpu_recovery_action": code}
    assert overall(verdicts) == (state, action)


@pytest.mark.parametrize("code", [0, None])
def test_none_needed_or_not_reported_is_no_finding(code: int | None) -> None:
    assert overall(evaluate(replace(GPU, recovery_action=code), RULES, NOW)) == ("healthy", "none")


def test_a_stronger_xid_finding_is_kept_and_a_stronger_driver_action_wins() -> None:
    with_xid = replace(GPU, xids={79: (1, 1)})  # fallen off the bus: reboot (catalog)
    verdicts = evaluate(replace(with_xid, recovery_action=1), RULES, NOW)
    assert verdicts["xid"].action == "reboot_node"
    verdicts = evaluate(replace(replace(GPU, xids={13: (1, 1)}), recovery_action=2), RULES, NOW)
    assert (verdicts["xid"].rule, verdicts["xid"].action) == ("driver_recovery_node_reboot", "reboot_node")

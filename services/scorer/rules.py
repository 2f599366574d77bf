"""The health rules: from a GPU's features to a verdict per subsystem, with evidence.

Every verdict names the rule that decided it and the evidence (values, counts,
window) behind it. A subsystem with no finding is healthy, so a verdict clears
by itself once its evidence ages out of the windows in config/health-rules.toml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.dcgm import ClockEventReason as Reason
from shared.dcgm import GpuRecoveryAction as Recovery
from shared.models_health import HEALTH_STATES as STATES
from shared.models_health import LADDER, SUBSYSTEMS, Action
from shared.wire_time import wire_time

from .escalation import FELL_OFF_THE_BUS, escalate, fall_off_action, xid_action, xid_counts
from .features import GpuFeatures
from .rules_config import Rules

__all__ = ["STATES", "SUBSYSTEMS", "Verdict", "escalate", "evaluate", "overall", "score"]


@dataclass(slots=True)
class Verdict:
    subsystem: str
    state: str = "healthy"
    rule: str | None = None
    action: Action = "none"
    evidence: dict[str, Any] = field(default_factory=dict)

    def worse(self, state: str, rule: str, action: Action, **evidence: Any) -> None:
        """Keep the worst finding of a subsystem (and, at equal state, the stronger action)."""
        rank, mine = STATES.index(state), STATES.index(self.state)
        if rank > mine or (rank == mine and rank > 0 and LADDER.index(action) > LADDER.index(self.action)):
            self.state, self.rule, self.action, self.evidence = state, rule, action, evidence


def _per_hour(count: int, g: GpuFeatures) -> float:
    """New counts per hour of elapsed time (not per rollup row: the rate must not depend on
    the poll cadence), over at least 10 minutes, so a GPU seen for two minutes cannot spike it."""
    seconds = g.span_long_s if g.span_long_s is not None else g.minutes_long * 60.0
    return count * 3600.0 / max(seconds, 600.0)


def evaluate(g: GpuFeatures, rules: Rules, as_of: datetime) -> dict[str, Verdict]:
    v: dict[str, Verdict] = {s: Verdict(s) for s in SUBSYSTEMS}
    w = rules.windows

    # availability: a GPU that stops reporting is a finding, not a gap
    age = (as_of - g.last_time).total_seconds() if g.last_time else None
    if age is None or age > rules.availability.missing_after_s:
        fell_off = fall_off_action("reboot_node", g.xids.get(FELL_OFF_THE_BUS), g.lost_times)
        v["availability"].worse(
            "unhealthy", "not_reporting", fell_off.action,
            last_seen=wire_time(g.last_time) if g.last_time else None,
            silent_s=round(age, 1) if age is not None else None,
            threshold_s=rules.availability.missing_after_s, **fell_off.evidence,
        )  # fmt: skip

    # memory / ECC (DCGM's MEM health watch)
    m, mem = rules.memory, v["memory"]
    if g.dbe_volatile >= m.dbe_volatile_fail:
        mem.worse("unhealthy", "volatile_dbe", "reset_gpu", dbe_volatile=g.dbe_volatile,
                  new_in_window=g.dbe_new, window_s=w.long_s)  # fmt: skip
    if g.remap_failure:
        mem.worse("unhealthy", "row_remap_failure", "inspect", row_remap_failure=1,
                  remapped_rows_uncorrectable=g.remapped_uncorrectable)  # fmt: skip
    if g.retired_pages >= m.retired_pages_fail:
        mem.worse("unhealthy", "retired_pages_limit", "inspect", retired_pages=g.retired_pages,
                  threshold=m.retired_pages_fail)  # fmt: skip
    if g.retired_pending >= m.retired_pending_warn:
        mem.worse("degraded", "page_retirement_pending", "reset_gpu", retired_pages_pending=g.retired_pending)
    if g.remap_pending:
        mem.worse("degraded", "row_remap_pending", "reset_gpu", row_remap_pending=1)
    sbe_rate = _per_hour(g.sbe_new, g)
    if sbe_rate >= m.sbe_per_hour_fail:
        mem.worse("unhealthy", "sbe_storm", "reset_gpu", sbe_per_hour=round(sbe_rate, 1),
                  new_sbe=g.sbe_new, window_s=w.long_s, threshold=m.sbe_per_hour_fail)  # fmt: skip
    elif sbe_rate >= m.sbe_per_hour_warn:
        mem.worse("degraded", "sbe_rate_high", "restart_workload", sbe_per_hour=round(sbe_rate, 1),
                  new_sbe=g.sbe_new, window_s=w.long_s, threshold=m.sbe_per_hour_warn)  # fmt: skip

    # thermal: against the GPU's own slowdown temperature
    t = v["thermal"]
    if g.temp_max is not None:
        evidence = {"temp_max_c": g.temp_max, "slowdown_c": g.slowdown_c, "window_s": w.short_s}
        if g.temp_max >= g.slowdown_c or g.reasons_any & Reason.HW_THERMAL_SLOWDOWN:
            t.worse("unhealthy", "hw_thermal_slowdown", "inspect", **evidence,
                    reasons=Reason.decode(g.reasons_any))  # fmt: skip
        elif (
            g.temp_max >= g.slowdown_c - rules.thermal.warn_margin_c
            or g.reasons_any & Reason.SW_THERMAL_SLOWDOWN
        ):
            t.worse(
                "degraded",
                "near_slowdown_temperature",
                "none",
                **evidence,
                margin_c=rules.thermal.warn_margin_c,
            )

    # power: a power brake is the board or node protecting itself
    if g.reasons_any & Reason.HW_POWER_BRAKE_SLOWDOWN:
        v["power"].worse("unhealthy", "hw_power_brake", "inspect", reasons=Reason.decode(g.reasons_any),
                         window_s=w.short_s)  # fmt: skip

    # PCIe replays
    p, pcie_rate = rules.pcie, _per_hour(g.pcie_new, g)
    if pcie_rate >= p.replays_per_hour_fail:
        v["pcie"].worse("unhealthy", "pcie_replay_storm", "inspect", replays_per_hour=round(pcie_rate, 1),
                        new_replays=g.pcie_new, window_s=w.long_s)  # fmt: skip
    elif pcie_rate >= p.replays_per_hour_warn:
        v["pcie"].worse("degraded", "pcie_replays", "none", replays_per_hour=round(pcie_rate, 1),
                        new_replays=g.pcie_new, window_s=w.long_s)  # fmt: skip

    # NVLink (DCGM's NVLINK watch: replay/recovery errors fail, CRC errors warn)
    n = rules.nvlink
    if g.nvlink_replay_recovery_new >= n.replay_recovery_fail:
        v["nvlink"].worse("unhealthy", "nvlink_replay_recovery", "reset_gpu",
                          new_replay_recovery=g.nvlink_replay_recovery_new, window_s=w.long_s)  # fmt: skip
    crc_rate = _per_hour(g.nvlink_crc_new, g)
    if crc_rate >= n.crc_per_hour_warn:
        v["nvlink"].worse("degraded", "nvlink_crc_errors", "none", crc_per_hour=round(crc_rate, 1),
                          window_s=w.long_s)  # fmt: skip

    # XIDs, by NVIDIA's catalog: each holds its verdict for its own time-to-clear; the action
    # escalates with repeats (escalation.py)
    for code, value in sorted(g.xids.items()):
        counts = xid_counts(value)
        if counts.recent == 0:
            continue
        known = rules.xid.get(code)
        severity = known.severity if known else "degraded"
        base: Action = known.action if known else "restart_workload"
        decision = xid_action(code, value, base, rules, g.lost_times)
        v["xid"].worse(
            severity, f"xid_{code}", decision.action,
            xid=code, name=known.name if known else "not in the catalog", count_in_window=counts.recent,
            window_s=rules.xid_clear_s(code), count_30d=counts.total, **decision.evidence,
        )  # fmt: skip
    driver_recovery_action(g, v["xid"])
    return v


# What the driver says a GPU needs (NVML's recovery action) -> (state, recommended action).
# Drain P2P: stop peer-to-peer traffic and ask again, so the workload goes first; drain and
# reset: the GPU runs at reduced capacity and needs a reset once its work is drained.
_RECOVERY: dict[int, tuple[str, Action]] = {
    Recovery.GPU_RESET: ("unhealthy", "reset_gpu"),
    Recovery.NODE_REBOOT: ("unhealthy", "reboot_node"),
    Recovery.DRAIN_P2P: ("degraded", "restart_workload"),
    Recovery.DRAIN_AND_RESET: ("degraded", "reset_gpu"),
}


def driver_recovery_action(g: GpuFeatures, verdict: Verdict) -> None:
    """The driver's own recovery action, where it reports one, as an XID-subsystem finding."""
    code = g.recovery_action
    if not code:
        return  # none needed, or a driver that does not say
    state, action = _RECOVERY.get(code, ("degraded", "inspect"))  # a code newer than this table
    verdict.worse(state, f"driver_recovery_{Recovery.name_of(code)}", action, gpu_recovery_action=code)


def overall(verdicts: dict[str, Verdict]) -> tuple[str, Action]:
    state = max((x.state for x in verdicts.values()), key=STATES.index)
    action = max((x.action for x in verdicts.values()), key=LADDER.index)
    return state, action


def score(verdicts: dict[str, Verdict], p_fail_30d: float, rules: Rules) -> tuple[float, str]:
    s = rules.score
    points = 100.0
    for x in verdicts.values():
        points -= (
            s.unhealthy_penalty
            if x.state == "unhealthy"
            else s.degraded_penalty
            if x.state == "degraded"
            else 0
        )
    points -= s.prediction_penalty * p_fail_30d
    points = max(0.0, min(100.0, points))
    grade = next(g for floor, g in s.grades if points >= floor)
    return round(points, 1), grade

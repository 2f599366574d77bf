"""The health rules: from a GPU's features to a verdict per subsystem, with evidence.

Every verdict names the rule that decided it and the evidence (values, counts,
window) behind it. A subsystem with no finding is healthy, so a verdict clears
by itself once its evidence ages out of the windows in config/health-rules.toml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuhealth.contract.wire_time import wire_time
from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from gpuhealth.gpu.driver_codes import GpuRecoveryAction as Recovery
from shared.contract.models_health import HEALTH_STATES as STATES
from shared.contract.models_health import LADDER, SUBSYSTEMS, Action
from shared.gpu.xid_catalog import XidEntry

from . import workflows
from .correlation import job_owns
from .escalation import FELL_OFF_THE_BUS, escalate, fall_off_action, xid_action, xid_counts
from .features import GpuFeatures
from .patterns import judge_pattern
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


def _per_hour(count: int, gpu: GpuFeatures) -> float:
    """New counts per hour of elapsed time (not per rollup row: the rate must not depend on
    the poll cadence), over at least 10 minutes, so a GPU seen for two minutes cannot spike it."""
    seconds = gpu.span_long_s if gpu.span_long_s is not None else gpu.minutes_long * 60.0
    return count * 3600.0 / max(seconds, 600.0)


def evaluate(
    gpu: GpuFeatures, rules: Rules, as_of: datetime, heard_until: datetime | None = None
) -> dict[str, Verdict]:
    """A GPU's verdict per subsystem as of `as_of`. `heard_until`: when the fleet was last heard from
    (shared.store.judging.fleet_heard_until; None: as_of), against which a GPU's silence is measured."""
    verdicts: dict[str, Verdict] = {subsystem: Verdict(subsystem) for subsystem in SUBSYSTEMS}
    windows = rules.windows

    # availability: a GPU that stops reporting while the fleet reports is a finding, not a gap; the
    # whole fleet falling silent together is the pipeline's outage (or restart), not every GPU's fault
    heard = as_of if heard_until is None else min(as_of, heard_until)
    age = (heard - gpu.last_time).total_seconds() if gpu.last_time else None
    if age is None or age > rules.availability.missing_after_s:
        fell_off = fall_off_action("reboot_node", gpu.xids.get(FELL_OFF_THE_BUS), gpu.lost_times)
        verdicts["availability"].worse(
            "unhealthy", "not_reporting", fell_off.action,
            last_seen=wire_time(gpu.last_time) if gpu.last_time else None,
            silent_s=round(age, 1) if age is not None else None,
            threshold_s=rules.availability.missing_after_s, **fell_off.evidence,
        )  # fmt: skip

    # memory / ECC (DCGM's MEM health watch). A failed row remap, or as many retired pages as
    # DCGM's RMA threshold, leaves no spare memory to repair in place: the GPU goes for repair.
    mem_rules, mem = rules.memory, verdicts["memory"]
    if gpu.dbe_volatile >= mem_rules.dbe_volatile_fail:
        mem.worse("unhealthy", "volatile_dbe", "reset_gpu", dbe_volatile=gpu.dbe_volatile,
                  new_in_window=gpu.dbe_new, window_s=windows.long_s)  # fmt: skip
    if gpu.remap_failure:
        mem.worse("unhealthy", "row_remap_failure", "send_for_repair", row_remap_failure=1,
                  remapped_rows_uncorrectable=gpu.remapped_uncorrectable)  # fmt: skip
    if gpu.retired_pages >= mem_rules.retired_pages_fail:
        mem.worse("unhealthy", "retired_pages_limit", "send_for_repair", retired_pages=gpu.retired_pages,
                  threshold=mem_rules.retired_pages_fail)  # fmt: skip
    if gpu.retired_pending >= mem_rules.retired_pending_warn:
        mem.worse(
            "degraded", "page_retirement_pending", "reset_gpu", retired_pages_pending=gpu.retired_pending
        )
    if gpu.remap_pending:
        mem.worse("degraded", "row_remap_pending", "reset_gpu", row_remap_pending=1)
    sbe_rate = _per_hour(gpu.sbe_new, gpu)
    if sbe_rate >= mem_rules.sbe_per_hour_fail:
        mem.worse(
            "unhealthy",
            "sbe_storm",
            "reset_gpu",
            sbe_per_hour=round(sbe_rate, 1),
            new_sbe=gpu.sbe_new,
            window_s=windows.long_s,
            threshold=mem_rules.sbe_per_hour_fail,
        )
    elif sbe_rate >= mem_rules.sbe_per_hour_warn:
        mem.worse(
            "degraded",
            "sbe_rate_high",
            "restart_workload",
            sbe_per_hour=round(sbe_rate, 1),
            new_sbe=gpu.sbe_new,
            window_s=windows.long_s,
            threshold=mem_rules.sbe_per_hour_warn,
        )

    # thermal: against the GPU's own slowdown temperature
    thermal = verdicts["thermal"]
    if gpu.temp_max is not None:
        evidence = {"temp_max_c": gpu.temp_max, "slowdown_c": gpu.slowdown_c, "window_s": windows.short_s}
        if gpu.temp_max >= gpu.slowdown_c or gpu.reasons_any & Reason.HW_THERMAL_SLOWDOWN:
            thermal.worse("unhealthy", "hw_thermal_slowdown", "inspect", **evidence,
                    reasons=Reason.names(gpu.reasons_any))  # fmt: skip
        elif (
            gpu.temp_max >= gpu.slowdown_c - rules.thermal.warn_margin_c
            or gpu.reasons_any & Reason.SW_THERMAL_SLOWDOWN
        ):
            thermal.worse(
                "degraded",
                "near_slowdown_temperature",
                "none",
                **evidence,
                margin_c=rules.thermal.warn_margin_c,
            )

    # power: a power brake is the board or node protecting itself (a PSU, a power cable)
    if gpu.reasons_any & Reason.HW_POWER_BRAKE_SLOWDOWN:
        verdicts["power"].worse(
            "unhealthy",
            "hw_power_brake",
            "check_mechanicals",
            reasons=Reason.names(gpu.reasons_any),
            window_s=windows.short_s,
        )

    # PCIe replays: link-level retries, the sign of a bad riser, cable or slot
    pcie_rules, pcie_rate = rules.pcie, _per_hour(gpu.pcie_new, gpu)
    if pcie_rate >= pcie_rules.replays_per_hour_fail:
        verdicts["pcie"].worse(
            "unhealthy",
            "pcie_replay_storm",
            "check_mechanicals",
            replays_per_hour=round(pcie_rate, 1),
            new_replays=gpu.pcie_new,
            window_s=windows.long_s,
        )
    elif pcie_rate >= pcie_rules.replays_per_hour_warn:
        verdicts["pcie"].worse("degraded", "pcie_replays", "none", replays_per_hour=round(pcie_rate, 1),
                        new_replays=gpu.pcie_new, window_s=windows.long_s)  # fmt: skip

    # NVLink (DCGM's NVLINK watch: replay/recovery errors fail, CRC errors warn)
    nvlink_rules = rules.nvlink
    if gpu.nvlink_replay_recovery_new >= nvlink_rules.replay_recovery_fail:
        verdicts["nvlink"].worse(
            "unhealthy",
            "nvlink_replay_recovery",
            "reset_gpu",
            new_replay_recovery=gpu.nvlink_replay_recovery_new,
            window_s=windows.long_s,
        )
    crc_rate = _per_hour(gpu.nvlink_crc_new, gpu)
    if crc_rate >= nvlink_rules.crc_per_hour_warn:
        verdicts["nvlink"].worse("degraded", "nvlink_crc_errors", "none", crc_per_hour=round(crc_rate, 1),
                          window_s=windows.long_s)  # fmt: skip

    # XIDs, by NVIDIA's catalogue (config/xid-catalog.csv): each holds its verdict for its own
    # time-to-clear; the action escalates with repeats (escalation.py)
    for code, value in sorted(gpu.xids.items()):
        counts = xid_counts(value)
        if counts.recent == 0:
            continue
        seen = {
            "count_in_window": counts.recent,
            "window_s": rules.xid_clear_s(code),
            "count_30d": counts.total,
        }
        entry = rules.xid.get(code)
        if (
            entry is not None
            and entry.xid_class == "application"
            and job_owns(gpu, code, counts, as_of, rules)
        ):
            continue  # the job's crash across its GPUs, not this GPU's fault: one finding for the job
        if entry is None:
            unknown = f"XID {code} is not in NVIDIA's catalogue: a person looks it up"
            verdicts["xid"].worse("degraded", f"xid_{code}", "inspect", xid=code, in_catalogue=False,
                                  name=unknown, **seen)  # fmt: skip
            continue
        if entry.workflow is not None:  # what accompanies it decides (workflows.py)
            judged = workflows.judge(entry, gpu, rules, as_of)
            state, action, evidence = judged.state, judged.action, judged.evidence
        else:
            decision = xid_action(code, value, entry.action, rules, gpu.lost_times)
            state, action, evidence = entry.severity, decision.action, decision.evidence
        if state == "info":
            continue  # NVIDIA: nothing to do (pattern rules may still count it)
        verdicts["xid"].worse(
            state, f"xid_{code}", action, **_catalogue_evidence(entry, gpu.model), **seen, **evidence
        )
    driver_recovery_action(gpu, verdicts["xid"])
    if gpu.remedy is not None:  # what came before it stays in the history; this says why it no longer counts
        verdicts["xid"].evidence = {**verdicts["xid"].evidence, "resolved_by": gpu.remedy}
    for (
        episode
    ) in gpu.episodes:  # a fault of the host or rack: the GPU's findings say whom they share it with
        if episode.scope != "job" and verdicts["xid"].state != "healthy":
            verdicts["xid"].evidence["shared_with"] = {
                "scope": episode.scope,
                "key": episode.key,
                "gpus": len(episode.gpus),
                "hosts": len(episode.hosts),
            }
    # pattern rules: what the GPU's record over the windows of the rules file's [[patterns]] says
    for pattern in rules.patterns:
        found = judge_pattern(
            pattern, gpu.pattern_bursts.get(pattern.name, ()), gpu.pattern_cancelled.get(pattern.name), as_of
        )
        if found is not None:
            verdicts[pattern.subsystem].worse(
                pattern.state, f"pattern_{pattern.name}", pattern.action, **found.evidence
            )
    hold_back_for_the_place(gpu, verdicts)
    return verdicts


# The place's own rung: a technician at the host or rack (power, cooling, seating, a switch).
PLACE_ACTION: Action = "check_mechanicals"


def hold_back_for_the_place(gpu: GpuFeatures, verdicts: dict[str, Verdict]) -> None:
    """A fault of the host or rack explains the repeats its GPUs show: while a GPU shares one, no
    pattern rule (a count over time, which the place's fault inflates on every GPU of it) sends it
    further up the ladder than the place's rung, so a bad rack is one visit, not a repair per GPU.
    What the GPU's own evidence proves (a failed row remap, the memory subsystem) stands. The
    evidence says what was held back and for whom."""
    places = [e for e in gpu.episodes if e.scope != "job"]
    if not places:
        return
    place = max(places, key=lambda e: (e.last, e.first))
    ceiling = LADDER.index(PLACE_ACTION)
    for subsystem, verdict in verdicts.items():
        counted = (verdict.rule or "").startswith("pattern_")
        if subsystem == "memory" or not counted or LADDER.index(verdict.action) <= ceiling:
            continue
        held = {"from": verdict.action, "scope": place.scope, "key": place.key, "gpus": len(place.gpus)}
        verdict.action, verdict.evidence = PLACE_ACTION, {**verdict.evidence, "held_back": held}


def _catalogue_evidence(entry: XidEntry, model: str) -> dict[str, Any]:
    """What the catalogue says of an XID, as a verdict's evidence: NVIDIA's facts beside this project's."""
    return {
        "xid": entry.code,
        "mnemonic": entry.mnemonic,
        "name": entry.description,
        "xid_class": entry.xid_class,
        "nvidia_action": entry.nvidia_action or None,
        "nvidia_investigation": entry.nvidia_investigation or None,
        # the contract's text limit: XID 74's bit-by-bit reason is longer, and a verdict carrying it whole
        # was refused by its contract and never published (the catalogue keeps it whole)
        "differs_because": (entry.reason if len(entry.reason) <= 1000 else entry.reason[:999] + "…") or None,
        "listed_for_model": entry.listed_for(model),
    }


def driver_recovery_action(gpu: GpuFeatures, verdict: Verdict) -> None:
    """The driver's own recovery action, where it reports one, as an XID-subsystem finding."""
    code = gpu.recovery_action
    if not code:
        return  # none needed, or a driver that does not say
    state, action = workflows.RECOVERY.get(code, ("degraded", "inspect"))  # a code newer than the table
    if state != "info":
        verdict.worse(state, f"driver_recovery_{Recovery.name_of(code)}", action, gpu_recovery_action=code)


def overall(verdicts: dict[str, Verdict]) -> tuple[str, Action]:
    state = max((verdict.state for verdict in verdicts.values()), key=STATES.index)
    action = max((verdict.action for verdict in verdicts.values()), key=LADDER.index)
    return state, action


def score(verdicts: dict[str, Verdict], p_fail_30d: float, rules: Rules) -> tuple[float, str]:
    weights = rules.score
    points = 100.0
    for verdict in verdicts.values():
        points -= (
            weights.unhealthy_penalty
            if verdict.state == "unhealthy"
            else weights.degraded_penalty
            if verdict.state == "degraded"
            else 0
        )
    points -= weights.prediction_penalty * p_fail_30d
    points = max(0.0, min(100.0, points))
    grade = next(grade_name for floor, grade_name in weights.grades if points >= floor)
    return round(points, 1), grade

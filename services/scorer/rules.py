"""The health rules: from a GPU's features to a verdict per subsystem, with evidence.

Every verdict names the rule that decided it and the evidence (values, counts,
window) behind it. A subsystem with no finding is healthy, so a verdict clears
by itself once its evidence ages out of the windows in config/health-rules.toml.
"""

from __future__ import annotations

from collections.abc import Callable
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
from .features import GpuFeatures, XidValue
from .patterns import judge_pattern
from .rules_config import Rules

__all__ = [
    "RULE_TABLE",
    "STATES",
    "SUBSYSTEMS",
    "Case",
    "Rule",
    "Verdict",
    "escalate",
    "evaluate",
    "overall",
    "score",
]


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


@dataclass(frozen=True, slots=True)
class Case:
    """What every rule judges: a GPU's features, the rules file, the time judged, and when the fleet
    was last heard from (no later than `as_of`), against which the GPU's silence is measured."""

    gpu: GpuFeatures
    rules: Rules
    as_of: datetime
    heard: datetime

    @classmethod
    def of(cls, gpu: GpuFeatures, rules: Rules, as_of: datetime, heard_until: datetime | None) -> Case:
        """The case of `evaluate`'s arguments: the fleet heard until `heard_until`, never after `as_of`."""
        return cls(gpu, rules, as_of, as_of if heard_until is None else min(as_of, heard_until))


Verdicts = dict[str, Verdict]
# A rule: what it finds in a case, written into the verdicts of its subsystem (`Verdict.worse`).
Rule = Callable[[Case, Verdicts], None]


def evaluate(
    gpu: GpuFeatures, rules: Rules, as_of: datetime, heard_until: datetime | None = None
) -> dict[str, Verdict]:
    """A GPU's verdict per subsystem as of `as_of`, by every rule of RULE_TABLE in its order.
    `heard_until`: when the fleet was last heard from (shared.store.judging.fleet_heard_until;
    None: as_of), against which a GPU's silence is measured."""
    verdicts: Verdicts = {subsystem: Verdict(subsystem) for subsystem in SUBSYSTEMS}
    case = Case.of(gpu, rules, as_of, heard_until)
    for rule in RULE_TABLE:
        rule(case, verdicts)
    return verdicts


def judge_availability(case: Case, verdicts: Verdicts) -> None:
    """A GPU that stops reporting while the fleet reports is a finding, not a gap; the whole fleet
    falling silent together is the pipeline's outage (or restart), not every GPU's fault."""
    gpu, threshold = case.gpu, case.rules.availability.missing_after_s
    age = (case.heard - gpu.last_time).total_seconds() if gpu.last_time else None
    if age is None or age > threshold:
        fell_off = fall_off_action("reboot_node", gpu.xids.get(FELL_OFF_THE_BUS), gpu.lost_times)
        verdicts["availability"].worse(
            "unhealthy",
            "not_reporting",
            fell_off.action,
            last_seen=wire_time(gpu.last_time) if gpu.last_time else None,
            silent_s=round(age, 1) if age is not None else None,
            threshold_s=threshold,
            **fell_off.evidence,
        )


def judge_memory(case: Case, verdicts: Verdicts) -> None:
    """Memory and ECC (DCGM's MEM health watch). A failed row remap, or as many retired pages as DCGM's
    RMA threshold, leaves no spare memory to repair in place: the GPU goes for repair."""
    gpu, limits, window_s, mem = case.gpu, case.rules.memory, case.rules.windows.long_s, verdicts["memory"]
    if gpu.dbe_volatile >= limits.dbe_volatile_fail:
        dbe = {"dbe_volatile": gpu.dbe_volatile, "new_in_window": gpu.dbe_new, "window_s": window_s}
        mem.worse("unhealthy", "volatile_dbe", "reset_gpu", **dbe)
    if gpu.remap_failure:
        remap = {"row_remap_failure": 1, "remapped_rows_uncorrectable": gpu.remapped_uncorrectable}
        mem.worse("unhealthy", "row_remap_failure", "send_for_repair", **remap)
    if gpu.retired_pages >= limits.retired_pages_fail:
        retired = {"retired_pages": gpu.retired_pages, "threshold": limits.retired_pages_fail}
        mem.worse("unhealthy", "retired_pages_limit", "send_for_repair", **retired)
    if gpu.retired_pending >= limits.retired_pending_warn:
        pending = gpu.retired_pending
        mem.worse("degraded", "page_retirement_pending", "reset_gpu", retired_pages_pending=pending)
    if gpu.remap_pending:
        mem.worse("degraded", "row_remap_pending", "reset_gpu", row_remap_pending=1)
    rate = _per_hour(gpu.sbe_new, gpu)
    sbe = {"sbe_per_hour": round(rate, 1), "new_sbe": gpu.sbe_new, "window_s": window_s}
    if rate >= limits.sbe_per_hour_fail:
        mem.worse("unhealthy", "sbe_storm", "reset_gpu", **sbe, threshold=limits.sbe_per_hour_fail)
    elif rate >= limits.sbe_per_hour_warn:
        mem.worse("degraded", "sbe_rate_high", "restart_workload", **sbe, threshold=limits.sbe_per_hour_warn)


def judge_thermal(case: Case, verdicts: Verdicts) -> None:
    """Against the GPU's own slowdown temperature, and the driver's thermal slowdown reasons."""
    gpu, margin_c = case.gpu, case.rules.thermal.warn_margin_c
    if gpu.temp_max is None:
        return
    evidence = {
        "temp_max_c": gpu.temp_max,
        "slowdown_c": gpu.slowdown_c,
        "window_s": case.rules.windows.short_s,
    }
    if gpu.temp_max >= gpu.slowdown_c or gpu.reasons_any & Reason.HW_THERMAL_SLOWDOWN:
        reasons = Reason.names(gpu.reasons_any)
        verdicts["thermal"].worse("unhealthy", "hw_thermal_slowdown", "inspect", **evidence, reasons=reasons)
    elif gpu.temp_max >= gpu.slowdown_c - margin_c or gpu.reasons_any & Reason.SW_THERMAL_SLOWDOWN:
        verdicts["thermal"].worse(
            "degraded", "near_slowdown_temperature", "none", **evidence, margin_c=margin_c
        )


def judge_power(case: Case, verdicts: Verdicts) -> None:
    """A power brake is the board or node protecting itself (a PSU, a power cable)."""
    if case.gpu.reasons_any & Reason.HW_POWER_BRAKE_SLOWDOWN:
        reasons, window_s = Reason.names(case.gpu.reasons_any), case.rules.windows.short_s
        verdicts["power"].worse(
            "unhealthy", "hw_power_brake", "check_mechanicals", reasons=reasons, window_s=window_s
        )


def judge_pcie(case: Case, verdicts: Verdicts) -> None:
    """PCIe replays: link-level retries, the sign of a bad riser, cable or slot."""
    gpu, limits = case.gpu, case.rules.pcie
    rate = _per_hour(gpu.pcie_new, gpu)
    seen = {
        "replays_per_hour": round(rate, 1),
        "new_replays": gpu.pcie_new,
        "window_s": case.rules.windows.long_s,
    }
    if rate >= limits.replays_per_hour_fail:
        verdicts["pcie"].worse("unhealthy", "pcie_replay_storm", "check_mechanicals", **seen)
    elif rate >= limits.replays_per_hour_warn:
        verdicts["pcie"].worse("degraded", "pcie_replays", "none", **seen)


def judge_nvlink(case: Case, verdicts: Verdicts) -> None:
    """NVLink (DCGM's NVLINK watch): replay/recovery errors fail, CRC errors warn."""
    gpu, limits, window_s = case.gpu, case.rules.nvlink, case.rules.windows.long_s
    if gpu.nvlink_replay_recovery_new >= limits.replay_recovery_fail:
        new = gpu.nvlink_replay_recovery_new
        verdicts["nvlink"].worse(
            "unhealthy", "nvlink_replay_recovery", "reset_gpu", new_replay_recovery=new, window_s=window_s
        )
    rate = _per_hour(gpu.nvlink_crc_new, gpu)
    if rate >= limits.crc_per_hour_warn:
        verdicts["nvlink"].worse(
            "degraded", "nvlink_crc_errors", "none", crc_per_hour=round(rate, 1), window_s=window_s
        )


def judge_xids(case: Case, verdicts: Verdicts) -> None:
    """XIDs, by NVIDIA's catalogue (config/xid-catalog.csv): each holds its verdict for its own
    time-to-clear; the action escalates with repeats (escalation.py). Then the driver's own recovery
    action, the remedy that resolved what came before, and the place whose fault the GPU shares."""
    gpu, verdict = case.gpu, verdicts["xid"]
    for code, value in sorted(gpu.xids.items()):
        one_xid(case, code, value, verdict)
    driver_recovery_action(gpu, verdict)
    if gpu.remedy is not None:  # what came before it stays in the history; this says why it counts no more
        verdict.evidence = {**verdict.evidence, "resolved_by": gpu.remedy}
    for episode in gpu.episodes:  # a fault of the host or rack: the findings say whom they share it with
        if episode.scope != "job" and verdict.state != "healthy":
            verdict.evidence["shared_with"] = {
                "scope": episode.scope,
                "key": episode.key,
                "gpus": len(episode.gpus),
                "hosts": len(episode.hosts),
            }


def one_xid(case: Case, code: int, value: XidValue, verdict: Verdict) -> None:
    """One XID code seen on the GPU, as a finding of the XID subsystem (none when it aged out, is a
    job's crash, or is one NVIDIA says needs nothing)."""
    gpu, rules = case.gpu, case.rules
    counts = xid_counts(value)
    if counts.recent == 0:
        return
    seen = {"count_in_window": counts.recent, "window_s": rules.xid_clear_s(code), "count_30d": counts.total}
    entry = rules.xid.get(code)
    if entry is None:
        unknown = f"XID {code} is not in NVIDIA's catalogue: a person looks it up"
        verdict.worse(
            "degraded", f"xid_{code}", "inspect", xid=code, in_catalogue=False, name=unknown, **seen
        )
        return
    if entry.xid_class == "application" and job_owns(gpu, code, counts, case.as_of, rules):
        return  # the job's crash across its GPUs, not this GPU's fault: one finding for the job
    if entry.workflow is not None:  # what accompanies it decides (workflows.py)
        judged = workflows.judge(entry, gpu, rules, case.as_of)
        state, action, evidence = judged.state, judged.action, judged.evidence
    else:
        decision = xid_action(code, value, entry.action, rules, gpu.lost_times)
        state, action, evidence = entry.severity, decision.action, decision.evidence
    if state != "info":  # info: NVIDIA says nothing to do (pattern rules may still count it)
        verdict.worse(
            state, f"xid_{code}", action, **_catalogue_evidence(entry, gpu.model), **seen, **evidence
        )


def judge_patterns(case: Case, verdicts: Verdicts) -> None:
    """Pattern rules: what the GPU's record over the windows of the rules file's [[patterns]] says."""
    gpu = case.gpu
    for pattern in case.rules.patterns:
        bursts, cancelled = gpu.pattern_bursts.get(pattern.name, ()), gpu.pattern_cancelled.get(pattern.name)
        found = judge_pattern(pattern, bursts, cancelled, case.as_of)
        if found is not None:
            rule = f"pattern_{pattern.name}"
            verdicts[pattern.subsystem].worse(pattern.state, rule, pattern.action, **found.evidence)


def cap_at_the_place(case: Case, verdicts: Verdicts) -> None:
    """The place's rung as the ceiling of what counting found, while the GPU shares a fault of its
    host or rack (hold_back_for_the_place)."""
    hold_back_for_the_place(case.gpu, verdicts)


# The rules, in the order they judge: each writes its subsystem's verdict (the patterns, the subsystem
# each pattern names); the XIDs' context before the patterns, and the place's ceiling last, over what
# the others found. A new subsystem is one more rule here.
RULE_TABLE: tuple[Rule, ...] = (
    judge_availability,
    judge_memory,
    judge_thermal,
    judge_power,
    judge_pcie,
    judge_nvlink,
    judge_xids,
    judge_patterns,
    cap_at_the_place,
)


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

"""The rule table judges as the one long `evaluate` did (issue 43): random features, the same verdicts.

`evaluate_before_the_table` below is the PRE-REFACTOR REFERENCE, frozen: services/scorer/rules.py's
`evaluate` as it stood at faee96a, before judgement became a table of one rule per subsystem, only
reformatted. It is an oracle for this test alone; nothing else may call it. A deliberate change to a
verdict changes it here too, in the same commit, or deletes this module once the table has served.
It uses the helpers the refactor left as they were (the rates, the catalogue's evidence, the driver's
recovery action, the place's ceiling, escalation, workflows and patterns).
"""

from __future__ import annotations

from datetime import datetime

from hypothesis import given, settings

from gpuhealth.contract.wire_time import wire_time
from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from services.scorer import workflows
from services.scorer.correlation import job_owns
from services.scorer.escalation import FELL_OFF_THE_BUS, fall_off_action, xid_action, xid_counts
from services.scorer.features import GpuFeatures
from services.scorer.patterns import judge_pattern
from services.scorer.rules import (
    SUBSYSTEMS,
    Verdict,
    _catalogue_evidence,
    _per_hour,
    driver_recovery_action,
    evaluate,
    hold_back_for_the_place,
)
from services.scorer.rules_config import Rules
from tests.helpers.scorer import NOW, RULES
from tests.helpers.scorer_inputs import HEARD_UNTIL, gpu_features


def evaluate_before_the_table(
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
            "unhealthy",
            "not_reporting",
            fell_off.action,
            last_seen=wire_time(gpu.last_time) if gpu.last_time else None,
            silent_s=round(age, 1) if age is not None else None,
            threshold_s=rules.availability.missing_after_s,
            **fell_off.evidence,
        )

    # memory / ECC (DCGM's MEM health watch). A failed row remap, or as many retired pages as
    # DCGM's RMA threshold, leaves no spare memory to repair in place: the GPU goes for repair.
    mem_rules, mem = rules.memory, verdicts["memory"]
    if gpu.dbe_volatile >= mem_rules.dbe_volatile_fail:
        mem.worse(
            "unhealthy",
            "volatile_dbe",
            "reset_gpu",
            dbe_volatile=gpu.dbe_volatile,
            new_in_window=gpu.dbe_new,
            window_s=windows.long_s,
        )
    if gpu.remap_failure:
        mem.worse(
            "unhealthy",
            "row_remap_failure",
            "send_for_repair",
            row_remap_failure=1,
            remapped_rows_uncorrectable=gpu.remapped_uncorrectable,
        )
    if gpu.retired_pages >= mem_rules.retired_pages_fail:
        mem.worse(
            "unhealthy",
            "retired_pages_limit",
            "send_for_repair",
            retired_pages=gpu.retired_pages,
            threshold=mem_rules.retired_pages_fail,
        )
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
            thermal.worse(
                "unhealthy",
                "hw_thermal_slowdown",
                "inspect",
                **evidence,
                reasons=Reason.names(gpu.reasons_any),
            )
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
        verdicts["pcie"].worse(
            "degraded",
            "pcie_replays",
            "none",
            replays_per_hour=round(pcie_rate, 1),
            new_replays=gpu.pcie_new,
            window_s=windows.long_s,
        )

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
        verdicts["nvlink"].worse(
            "degraded", "nvlink_crc_errors", "none", crc_per_hour=round(crc_rate, 1), window_s=windows.long_s
        )

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
            verdicts["xid"].worse(
                "degraded", f"xid_{code}", "inspect", xid=code, in_catalogue=False, name=unknown, **seen
            )
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


@settings(max_examples=400, deadline=None)
@given(gpu=gpu_features(), heard_until=HEARD_UNTIL)
def test_the_table_judges_as_the_long_function_did(gpu: GpuFeatures, heard_until: datetime | None) -> None:
    assert evaluate(gpu, RULES, NOW, heard_until) == evaluate_before_the_table(gpu, RULES, NOW, heard_until)

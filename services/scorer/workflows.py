"""NVIDIA's workflow XIDs, judged from what accompanies them (the catalogue's `workflow` column).

- xid_13, xid_31: the workload's fault, unless they keep coming back on this GPU
  (more than `[xid_repeats] count` separate occurrences in its window). Then 31 is
  a possible hardware fault (run diagnostics); 13 is one when the repeats hit the
  same GPC and TPC, and the application's when they hit different ones.
- xid_45: alone, the job was torn down (restart it); after another XID, or naming its
  cause (`... caused by previous Xid 149`), it follows that XID: its verdict stands
  (or, its line never seen, its catalogue action), and the evidence names the cause.
- xid_48: a DBE alone is a reset; with a row remapped (XID 63, a pending remap) a
  reset puts the repair in force; with a remap that failed (XID 64, the remap
  failure flag) the memory cannot be repaired in place: send for repair.
- nvlink (74): the registers' bits by NVIDIA's NVLink workflow (the catalogue's reason
  for 74 goes bit by bit): a reset; link-hardware bits again: check the connections;
  the third register's bits 16/19 again: field diagnostics and a bug report.
- nvlink5 (144-150): intrInfo and errorStatus by NVIDIA's decode table; a message it
  cannot decode takes the catalogue's reset unless the driver called it `Nonfatal`.
- xid_154: the recovery action the message names.

Where a decode needs the kernel log's message and there is none (the XID came from
dcgm-exporter or NVML) or it cannot be read, the verdict says so and takes the
catalogue's action for the code: the safe one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpuhealth.gpu.driver_codes import GpuRecoveryAction as Recovery
from shared.contract.models_health import LADDER, Action
from shared.gpu.nvlink_decode import (
    GENERATIONS,
    decode_nvlink5,
    decode_nvlink74,
    generation_of,
    parse_nvlink5_message,
)
from shared.gpu.xid_catalog import XidEntry, XidSeverity

from .escalation import escalate, xid_counts
from .features import GpuFeatures, XidEvent
from .rules_config import Rules

STATES: tuple[XidSeverity, ...] = ("info", "degraded", "unhealthy")

# What the driver says a GPU needs (NVML's recovery action, XID 154's message) -> (state, action).
# Drain P2P: stop peer-to-peer traffic and ask again, so the workload goes first; drain and
# reset: the GPU runs at reduced capacity and needs a reset once its work is drained.
RECOVERY: dict[int, tuple[XidSeverity, Action]] = {
    Recovery.NONE: ("info", "none"),
    Recovery.GPU_RESET: ("unhealthy", "reset_gpu"),
    Recovery.NODE_REBOOT: ("unhealthy", "reboot_node"),
    Recovery.DRAIN_P2P: ("degraded", "restart_workload"),
    Recovery.DRAIN_AND_RESET: ("degraded", "reset_gpu"),
    Recovery.RECOVER_IMEX_DOMAIN: ("degraded", "inspect"),  # the IMEX domain, not this GPU: a person
    Recovery.BUS_RESET: ("unhealthy", "reset_gpu"),  # a reset of the GPU's PCIe bus
    Recovery.SYSTEM_REBOOT: ("unhealthy", "reboot_node"),
}
_RECOVERY_TO = re.compile(r"\bto\s+0x(?P<code>[0-9A-Fa-f]{1,8})\b")
_LOCATION = re.compile(r"\(GPC\s*(?P<gpc>\d{1,3}),\s*TPC\s*(?P<tpc>\d{1,3})")
# The driver's own note on an XID 45 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL) that another XID caused.
_CAUSED_BY = re.compile(r"caused by previous Xid\s*(?P<code>\d{1,6})", re.IGNORECASE)
_MAX_SHOWN = 5  # occurrences listed in the evidence


@dataclass(slots=True)
class Judgement:
    state: XidSeverity
    action: Action
    evidence: dict[str, Any] = field(default_factory=dict)

    def at_least(self, state: XidSeverity, action: Action) -> None:
        if (STATES.index(state), LADDER.index(action)) > (
            STATES.index(self.state),
            LADDER.index(self.action),
        ):
            self.state, self.action = state, action


def _stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _times(gpu: GpuFeatures, code: int) -> list[datetime]:
    """Every known time of `code` on this GPU: its events, and the counts' newest times."""
    found = {e.time for e in gpu.xid_events.get(code, ())}
    value = gpu.xids.get(code)
    for text in xid_counts(value).times if value is not None else ():
        try:
            found.add(datetime.fromisoformat(text))
        except ValueError:
            continue
    return sorted(found, reverse=True)


def _recent(gpu: GpuFeatures, code: int, window_s: float, as_of: datetime) -> list[XidEvent]:
    return [e for e in gpu.xid_events.get(code, ()) if e.time > as_of - timedelta(seconds=window_s)]


def _companions(
    gpu: GpuFeatures, code: int, at: datetime, rules: Rules, *, codes: set[int] | None = None
) -> list[int]:
    """Other XIDs on this GPU within `companion_s` of `at` (any other code, or those in `codes`)."""
    near = timedelta(seconds=rules.workflows.companion_s)
    wanted = codes if codes is not None else set(gpu.xids) - {code}
    return sorted(c for c in wanted if c != code and any(abs(t - at) <= near for t in _times(gpu, c)))


def _bursts(times: list[datetime], burst_s: float) -> list[list[datetime]]:
    """Times grouped into occurrences: one fault's lines, closer than burst_s, are one."""
    groups: list[list[datetime]] = []
    for t in sorted(times):
        if groups and (t - groups[-1][-1]).total_seconds() <= burst_s:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


def _repeats(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    """13 and 31: the workload's fault unless they keep coming back on this GPU."""
    code, repeats = entry.code, rules.xid_repeats
    counts = xid_counts(gpu.xids[code])
    events = _recent(gpu, code, repeats.window_s, as_of)
    if events:
        bursts = _bursts([e.time for e in events], rules.workflows.burst_s)
        occurrences = len(bursts)
    else:
        bursts, occurrences = (
            [],
            counts.in_repeat_window if counts.in_repeat_window is not None else counts.recent,
        )
    seen = {
        "occurrences_in_repeat_window": occurrences,
        "repeat_window_s": repeats.window_s,
        "escalates_above": repeats.count,
        "burst_s": rules.workflows.burst_s,
    }
    if occurrences <= repeats.count:
        return Judgement(
            "degraded", "restart_workload", {**seen, "workflow": "solo or few: the application's"}
        )
    if code == 31:
        return Judgement(
            "unhealthy",
            "run_diagnostics",
            {**seen, "workflow": "MMU faults keep coming back on this GPU: possible hardware"},
        )
    located: dict[tuple[int, int], int] = {}
    for burst in bursts:
        texts = [e.message or "" for e in events if e.time in burst]
        where = {(int(m["gpc"]), int(m["tpc"])) for text in texts if (m := _LOCATION.search(text[:1000]))}
        for spot in where:
            located[spot] = located.get(spot, 0) + 1
    if not located:
        return Judgement(
            "unhealthy",
            "run_diagnostics",
            {
                **seen,
                "decode": "not possible: no GPC/TPC in a "
                "kernel message (or none read): assumed the same place",
                "workflow": "repeats",
            },
        )
    spot, hits = max(located.items(), key=lambda kv: kv[1])
    if hits >= 2:
        return Judgement(
            "unhealthy",
            "run_diagnostics",
            {
                **seen,
                "repeated_at": f"GPC {spot[0]}, TPC {spot[1]}",
                "occurrences_there": hits,
                "workflow": "repeats at one GPC and TPC: possible hardware",
            },
        )
    return Judgement(
        "degraded",
        "restart_workload",
        {
            **seen,
            "locations": [f"GPC {g}, TPC {t}" for g, t in located],
            "workflow": "repeats at different places: the application's",
        },
    )


def named_cause(message: str | None) -> int | None:
    """The XID an XID 45's message names as its cause (`caused by previous Xid N`), if any."""
    found = _CAUSED_BY.search((message or "")[:1000])
    code = int(found["code"]) if found is not None else None
    return code if code is not None and code != 45 and 0 < code <= 100_000 else None


def _xid_45(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    clear = timedelta(seconds=rules.xid_clear_s(45))
    times = [t for t in _times(gpu, 45) if t > as_of - clear]
    causes: dict[datetime, int] = {
        e.time: code for e in gpu.xid_events.get(45, ()) if (code := named_cause(e.message)) is not None
    }
    named = sorted(set(causes.values()))
    others = {c for c, v in gpu.xids.items() if c not in (45, 154) and xid_counts(v).recent > 0}
    if not times:  # counts without times: accompanied if another XID is recent too
        followed = sorted(others)
        solo = 0 if followed else xid_counts(gpu.xids[45]).recent
    else:
        after = {t: _companions(gpu, 45, t, rules, codes=others) for t in times if t not in causes}
        followed = sorted({c for cs in after.values() for c in cs} | set(named))
        solo = sum(1 for cs in after.values() if not cs)
    if solo == 0:
        judged = Judgement(
            "info", "none", {"workflow": "follows another XID, whose verdict stands", "follows": followed}
        )
    else:
        judged = Judgement(
            "degraded", "restart_workload", {"workflow": "solo: the job was torn down", "solo": solo}
        )
        if solo > rules.xid_repeats.count:
            judged.action = escalate("restart_workload", 1)
            judged.evidence["escalates_above"] = rules.xid_repeats.count
    if named:
        judged.evidence["caused_by"] = named  # as the driver wrote it in the 45's message
        unseen = [c for c in named if c not in gpu.xids]
        for code in unseen:
            cause = rules.xid.get(code)
            if cause is not None:
                judged.at_least(cause.severity, cause.action)
        if unseen:
            judged.evidence["cause_not_seen"] = unseen
            judged.evidence["workflow"] = (
                "names its cause, whose own line was not seen: the cause's catalogue action"
            )
    return judged


def _xid_48(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    counts = xid_counts(gpu.xids[48])
    times = _times(gpu, 48)
    with_codes = sorted({c for t in times for c in _companions(gpu, 48, t, rules, codes={63, 64, 171, 172})})
    if not times:
        with_codes = sorted(c for c in (63, 64, 171, 172) if c in gpu.xids and xid_counts(gpu.xids[c]).recent)
    memory = "SRAM" if 172 in with_codes else "DRAM" if 171 in with_codes else None
    base = {
        "with_xids": with_codes,
        "memory": memory,
        "row_remap_failure": bool(gpu.remap_failure),
        "row_remap_pending": bool(gpu.remap_pending),
    }
    if 64 in with_codes or gpu.remap_failure:
        return Judgement(
            "unhealthy",
            "send_for_repair",
            {**base, "workflow": "the DBE's row could not be remapped: no repair in place"},
        )
    if 63 in with_codes or gpu.remap_pending:
        judged = Judgement(
            "unhealthy",
            "reset_gpu",
            {**base, "workflow": "row remapped: drain, then reset to put it in force"},
        )
    else:
        judged = Judgement(
            "unhealthy",
            "reset_gpu",
            {**base, "workflow": "solo: reset, then run diagnostics", "then": "run_diagnostics"},
        )
    judged.action = escalate(judged.action, counts.total - 1)
    return judged


def _undecoded(entry: XidEntry, events: list[XidEvent], why: str) -> dict[str, Any]:
    shown = [{"time": _stamp(e.time), "source": e.source} for e in events[:_MAX_SHOWN]]
    return {
        "decode": f"not possible: {why}; took the catalogue's action for XID {entry.code}",
        "not_decoded": shown,
    }


def _messages(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> list[XidEvent]:
    return _recent(gpu, entry.code, rules.xid_clear_s(entry.code), as_of)


def _nvlink74(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    events = _messages(entry, gpu, rules, as_of)
    decoded = [(e, d) for e in events if e.message and (d := decode_nvlink74(e.message)) is not None]
    if not decoded:
        why = (
            "no kernel log message (seen by "
            + ", ".join(sorted({e.source for e in events}) or {"dcgm"})
            + ")"
        )
        if any(e.message for e in events):
            why = "no NVLink registers in the kernel message"
        judged = Judgement(entry.severity, entry.action, _undecoded(entry, events, why))
        judged.action = escalate(judged.action, xid_counts(gpu.xids[74]).total - 1)
        return judged
    classes = {kind for _, d in decoded for kind in d.classes}
    links = sorted({d.link for _, d in decoded})
    shown = [{"time": _stamp(e.time), "link": d.link, "bits": d.classes} for e, d in decoded[:_MAX_SHOWN]]
    base: dict[str, Any] = {"decoded": shown, "links": links}
    if classes <= {"ignorable"}:
        return Judgement("info", "none", {**base, "workflow": "only bits NVIDIA says to ignore"})
    if classes <= {"ignorable", "sympathetic"}:
        others = sorted({c for e, _ in decoded for c in _companions(gpu, 74, e.time, rules)})
        if others:
            return Judgement("info", "none", {**base, "workflow": "sympathetic: follows", "follows": others})
        return Judgement(
            "degraded", "inspect", {**base, "workflow": "sympathetic bits alone: report to NVIDIA"}
        )
    judged = Judgement("unhealthy", "reset_gpu", {**base, "workflow": "a reset clears the link error"})
    same_link = max(sum(1 for _, d in decoded if d.link == link) for link in links)
    if "mechanical" in classes:
        judged.evidence["then"] = "check_mechanicals"
        if len(decoded) > 1:
            judged.action = "check_mechanicals"
            judged.evidence["workflow"] = "link hardware bits again: reseat and check the link's connections"
    repeated = [d for _, d in decoded if "repeat_diagnose" in d.classes]
    if len(repeated) > 1:  # NVIDIA: "if seen repeatedly, please run Field Diags and report a bug"
        judged.at_least("unhealthy", "run_diagnostics")
        judged.evidence["workflow"] = "the third register's bits 16/19 again: field diagnostics, then report"
        judged.evidence["report"] = "NVIDIA asks for a bug report when these bits repeat"
    if classes & {"unexpected", "repeat_report"} or ("ecc_parity" in classes and same_link > 2):
        judged.at_least("unhealthy", "inspect")
        judged.evidence["report"] = "bits NVIDIA asks to have reported (unexpected, or repeated ECC/parity)"
    return judged


def _nvidia_action(bucket: str, rules: Rules, follow_154: Judgement | None) -> tuple[XidSeverity, Action]:
    if bucket == "XID_154_EVAL":  # the action an accompanying XID 154 names; without one, restart the app
        return (follow_154.state, follow_154.action) if follow_154 else ("degraded", "restart_workload")
    action = rules.xid_catalog.mapping().get(bucket, "inspect")
    return (
        "info" if action == "none" else "unhealthy" if action != "restart_workload" else "degraded"
    ), action


def _nvlink5(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    events = _messages(entry, gpu, rules, as_of)
    generation = generation_of(gpu.driver_version)
    judged: Judgement | None = None
    decoded: list[dict[str, Any]] = []
    missing: list[XidEvent] = []
    unread: list[XidEvent] = []
    for e in events:
        if not e.message:
            missing.append(e)
            continue
        found = decode_nvlink5(rules.nvlink5, entry.code, e.message, generation)
        if found is None:
            unread.append(e)
            continue
        near_154 = [
            t for t in _times(gpu, 154) if abs(t - e.time) <= timedelta(seconds=rules.workflows.companion_s)
        ]
        follow = _xid_154(rules.xid[154], gpu, rules, as_of) if near_154 and 154 in rules.xid else None
        for row in found.rows:
            nvidia = row.nvidia_action2 if found.promoted and row.nvidia_action2 else row.nvidia_action
            state, action = _nvidia_action(nvidia, rules, follow)
            if "fatal" in row.severity.lower() and "non" not in row.severity.lower():
                state = "unhealthy"
            judged = judged or Judgement(state, action)
            judged.at_least(state, action)
        decoded.append(
            {
                "time": _stamp(e.time),
                "link": found.message.link,
                "subcode": found.subcode,
                "generation": f"{found.generation} ({GENERATIONS[found.generation]})",
                "error_status": f"0x{found.message.error_status:08x}",
                "promoted": found.promoted,
                "severity": " + ".join(dict.fromkeys(r.severity for r in found.rows)),
                "nvidia_action": " + ".join(dict.fromkeys(r.nvidia_action for r in found.rows)),
                "nvidia_investigation": " + ".join(dict.fromkeys(r.nvidia_investigation for r in found.rows)),
            }
        )
    evidence: dict[str, Any] = {"decoded": decoded[:_MAX_SHOWN], "driver_generation": generation}
    said = {id(e): parse_nvlink5_message(e.message or "") for e in unread}
    nonfatal = [e for e in unread if (m := said[id(e)]) is not None and not m.fatal_in_text]
    unsafe = [e for e in unread if e not in nonfatal]
    if missing or unsafe:
        if missing:
            why = "no kernel log message (seen by " + ", ".join(sorted({e.source for e in missing})) + ")"
        elif any(said[id(e)] is None for e in unsafe):
            why = "no sub-unit, severity, intrInfo and errorStatus in the message"
        else:
            why = "the message matches no single row of NVIDIA's table" + (
                "" if generation else " (driver generation unknown)"
            )
        evidence |= _undecoded(entry, missing + unsafe, why)
        judged = judged or Judgement(entry.severity, entry.action)
        judged.at_least(entry.severity, entry.action)
    if nonfatal:
        evidence["driver_severity"] = {
            "decode": "not possible: the message matches no single row of NVIDIA's table; the driver "
            "itself calls it Nonfatal: took NVIDIA's action for its non-fatal errors",
            "nonfatal": [{"time": _stamp(e.time), "source": e.source} for e in nonfatal[:_MAX_SHOWN]],
        }
        judged = judged or Judgement("info", "none")
    if judged is None:  # nothing recent at all: the catalogue's action, as before
        judged = Judgement(entry.severity, entry.action, _undecoded(entry, [], "no message"))
        evidence |= judged.evidence
    judged.evidence = evidence
    return judged


def _xid_154(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    events = _messages(entry, gpu, rules, as_of)
    for e in events:  # the newest that can be read says what the GPU needs now
        found = _RECOVERY_TO.search((e.message or "")[:1000])
        if found is not None:
            code = int(found["code"], 16)
            state, action = RECOVERY.get(code, ("degraded", "inspect"))
            return Judgement(
                state,
                action,
                {
                    "recovery_action": code,
                    "workflow": "the action the driver names",
                    "message_time": _stamp(e.time),
                },
            )
    why = (
        "no kernel log message" if not any(e.message for e in events) else "no recovery action in the message"
    )
    return Judgement(entry.severity, entry.action, _undecoded(entry, events, why))


WORKFLOWS: dict[str, Callable[[XidEntry, GpuFeatures, Rules, datetime], Judgement]] = {
    "xid_13": _repeats,
    "xid_31": _repeats,
    "xid_45": _xid_45,
    "xid_48": _xid_48,
    "nvlink": _nvlink74,
    "nvlink5": _nvlink5,
    "xid_154": _xid_154,
}


def judge(entry: XidEntry, gpu: GpuFeatures, rules: Rules, as_of: datetime) -> Judgement:
    """The verdict of a workflow XID seen within its time-to-clear on this GPU."""
    if entry.workflow is None:
        raise ValueError(f"XID {entry.code} has no workflow")
    return WORKFLOWS[entry.workflow](entry, gpu, rules, as_of)

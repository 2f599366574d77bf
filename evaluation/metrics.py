"""From a run's record and the mock's ground truth to the figures an operator would check.

- detection: every hard failure (DBE, failed remap, fall off the bus, critical
  XID) must turn its subsystem unhealthy within one scoring cycle (counted from
  the first poll after the fault: delay <= score_every_s + poll_s); other
  faults report their time to detect;
- false alarms: GPUs with no fault (and hot ones: a sustained heavy workload)
  ever judged unhealthy, or degraded;
- clearing: faults that ended must leave their subsystem healthy once their
  evidence has aged out (the window of the rule, or the XID's time-to-clear);
- remediation (the remediator in dry-run, evaluation/remediation.py): healthy GPUs
  whose node it would have cordoned (the goal is none), hard faults it acted on (a
  plan for the GPU opened after the fault: running, or held for an operator or by
  the breaker) and cordoned, and the time from the fault to the cordon and to the drain;
- escalation: a second and third fall off the bus must recommend inspect or more; a
  single application XID (the catalogue's application class) must never go past restart_workload;
- what several GPUs show together (evaluation/shared_faults.py): a job's crash must be one job
  finding and escalate none of its GPUs past restart_workload; a node or rack fault must be one
  finding for the place, not its GPUs escalated past what the signal gets on one GPU alone
  (counted N times). A GPU whose only faults are job crashes counts as healthy here;
- prediction: a GPU counts as predicted when p(fail 30 d) >= threshold at a
  prediction made BEFORE its ground-truth failure time; precision over all
  predicted GPUs, recall over GPUs with a precursor, lead time from the first
  such prediction to the failure; p30 on healthy GPUs; and calibration
  (Brier score, reliability table) over every prediction made before a failure.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from services.scorer.rules_config import Rules
from shared.contract.models_health import LADDER

from .run import Record
from .shared_faults import SHARED_CLASSES, SharedFigures, shared_figures

HOUR_MS = 3_600_000
_BINS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0000001)


@dataclass(slots=True)
class Summary:
    scenario: str
    seed: int
    hard_faults: int = 0
    hard_within_cycle: int = 0
    hard_delays_s: list[float] = field(default_factory=list)
    other_delays: dict[str, list[float | None]] = field(default_factory=dict)
    healthy_gpus: int = 0
    hot_gpus: int = 0
    false_unhealthy: int = 0
    false_degraded: int = 0
    hot_unhealthy: int = 0
    hot_degraded: int = 0
    ended_faults: int = 0
    cleared: int = 0
    fall_off_repeats: int = 0
    fall_off_repeats_inspect: int = 0
    single_app_xids: int = 0
    single_app_xid_past_restart: int = 0
    app_xid_bursts: int = 0
    app_xid_bursts_escalated: int = 0
    predicted: int = 0
    true_predicted: int = 0
    with_precursor: int = 0
    with_precursor_predicted: int = 0
    long_lead: int = 0
    long_lead_predicted: int = 0
    leads_h: list[float] = field(default_factory=list)
    long_leads_h: list[float] = field(default_factory=list)
    healthy_p30_max: float = 0.0
    calibration: list[tuple[float, int]] = field(default_factory=list)  # (p30, label)
    plans: int = 0
    plans_held_by_breaker: int = 0
    healthy_cordoned: int = 0  # healthy GPUs (hot ones included) whose node the remediator took out
    hard_acted: int = 0
    hard_cordoned: int = 0
    cordon_delays_s: list[float] = field(default_factory=list)
    drain_delays_s: list[float] = field(default_factory=list)
    # per class of shared fault (job, node, rack): faults, seen as one finding, GPUs, blamed, escalated
    shared: dict[str, SharedFigures] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)  # what went wrong, in words, for the report


def _state_at(rec: Record, gpu: str, sub: str, at_ms: int) -> tuple[int, str] | None:
    """The first scoring cycle at or after at_ms and the subsystem's state then."""
    for t, states, _ in rec.cycles:
        if t >= at_ms:
            return t, states.get(gpu, {}).get(sub, "healthy")
    return None


def _first(rec: Record, gpu: str, sub: str, start_ms: int, states: tuple[str, ...]) -> int | None:
    for t, snapshot, _ in rec.cycles:
        if t >= start_ms and snapshot.get(gpu, {}).get(sub, "healthy") in states:
            return t
    return None


def _max_action(rec: Record, gpu: str, lo_ms: int, hi_ms: int) -> str:
    actions = [a.get(gpu, "none") for t, _, a in rec.cycles if lo_ms <= t <= hi_ms]
    return max(actions, key=LADDER.index) if actions else "none"


def _age_out_s(fault: dict[str, Any], rules: Rules) -> float:
    sub = fault["subsystem"]
    if sub == "xid":
        return rules.xid_clear_s(int(fault["params"]["code"]))
    if sub in ("thermal", "power"):
        return rules.windows.short_s
    if sub == "availability":
        return 0.0
    return rules.windows.long_s


def _lasts_past(fault: dict[str, Any], at_ms: int, rules: Rules, cycle: float) -> bool:
    """Whether this fault's evidence can still hold a verdict at at_ms."""
    end = fault["end_ms"]
    return end is None or end + (_age_out_s(fault, rules) + cycle) * 1000 > at_ms


def summarise(rec: Record, rules: Rules) -> Summary:
    s = Summary(scenario=rec.scenario, seed=rec.seed)
    faults = rec.truth["faults"]
    failures: dict[str, dict[str, Any]] = rec.truth["failures"]
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for f in faults:
        by_gpu.setdefault(f["gpu_uuid"], []).append(f)
    cycle = rec.score_every_s + rec.poll_s
    app_codes = {code for code, entry in rules.xid.items() if entry.xid_class == "application"}

    for f in faults:
        gpu, sub, start = f["gpu_uuid"], f["subsystem"], f["start_ms"]
        if f.get("job_crash") is not None:
            continue  # judged as the job's crash (shared_faults.py), not as the GPU's XID
        if f["hard_failure"]:
            s.hard_faults += 1
            seen = _first(rec, gpu, sub, start, ("unhealthy",))
            if seen is not None:
                s.hard_delays_s.append((seen - start) / 1000)
                s.hard_within_cycle += (seen - start) / 1000 <= cycle
            if seen is None or (seen - start) / 1000 > cycle:
                late = "never" if seen is None else f"after {(seen - start) / 1000:.0f} s"
                s.misses.append(f"{f['kind']} {f['params']} on {gpu} at {start}: {sub} unhealthy {late}")
        elif sub is not None:
            seen = _first(rec, gpu, sub, start, ("degraded", "unhealthy"))
            s.other_delays.setdefault(f["kind"], []).append(None if seen is None else (seen - start) / 1000)
        # clearing: the fault ended, its evidence aged out, and nothing else on that subsystem since
        if sub is not None and f["end_ms"] is not None:
            due = f["end_ms"] + int((_age_out_s(f, rules) + cycle) * 1000)
            later = [g for g in by_gpu[gpu] if g is not f and g["subsystem"] == sub and g["start_ms"] <= due
                     and _lasts_past(g, f["end_ms"], rules, cycle)]  # fmt: skip
            got = None if later or due > rec.end_ms else _state_at(rec, gpu, sub, due)
            if got is not None:
                s.ended_faults += 1
                s.cleared += got[1] == "healthy"

    for gpu, fs in by_gpu.items():
        fs = [f for f in fs if f.get("job_crash") is None]
        if not fs:
            continue
        kinds = {f["kind"] for f in fs}
        offs = sorted((f for f in fs if f["kind"] == "fall_off_bus"), key=lambda f: f["start_ms"])
        for f in offs[1:]:
            end = f["end_ms"] or rec.end_ms
            s.fall_off_repeats += 1
            top = _max_action(rec, gpu, f["start_ms"], end + int(cycle * 1000))
            s.fall_off_repeats_inspect += LADDER.index(top) >= LADDER.index("inspect")
        apps = [f for f in fs if f["kind"] == "xid" and int(f["params"]["code"]) in app_codes]
        if apps and kinds == {"xid"} and len(apps) == len(fs):
            if len(apps) == 1:
                s.single_app_xids += 1
                past = LADDER.index(_max_action(rec, gpu, 0, rec.end_ms)) > LADDER.index("restart_workload")
                s.single_app_xid_past_restart += past
            elif len(apps) > rules.xid_repeats.count:
                s.app_xid_bursts += 1
                rank = LADDER.index(_max_action(rec, gpu, 0, rec.end_ms))
                s.app_xid_bursts_escalated += rank > LADDER.index("restart_workload")

    healthy = [
        g
        for g in rec.gpus
        if all(f["kind"] == "heavy_workload" or f.get("job_crash") is not None for f in by_gpu.get(g, []))
    ]
    hot = {g for g in healthy if any(f["kind"] == "heavy_workload" for f in by_gpu.get(g, []))}  # fmt: skip
    s.healthy_gpus, s.hot_gpus = len(healthy), len(hot)
    for g in healthy:
        worst = {st for _, states, _ in rec.cycles for st in states.get(g, {}).values()}
        s.false_unhealthy += "unhealthy" in worst
        s.false_degraded += bool(worst)
        if g in hot:
            s.hot_unhealthy += "unhealthy" in worst
            s.hot_degraded += bool(worst)
    s.shared = shared_figures(rec, rules, s.misses)
    _prediction(s, rec, rules, failures, healthy)
    _remediation(s, rec, faults, set(healthy))
    return s


def _remediation(s: Summary, rec: Record, faults: list[dict[str, Any]], healthy: set[str]) -> None:
    s.plans = len(rec.remediations)
    s.plans_held_by_breaker = sum(p["held_for"] == "breaker" for p in rec.remediations)
    taken_out = {g for p in rec.remediations if p["cordoned_ms"] is not None for g in p["gpus"]}
    s.healthy_cordoned = len(taken_out & healthy)
    for g in sorted(taken_out & healthy):
        s.misses.append(f"healthy {g}: its node cordoned by the remediator")
    for f in faults:
        if not f["hard_failure"]:
            continue
        # a plan for the GPU opened after the fault, or one open when it came (the GPU joined it)
        plans = [p for p in rec.remediations if f["gpu_uuid"] in p["gpus"]
                 and (p["decided_ms"] >= f["start_ms"] or p["state"] in ("held", "running"))]  # fmt: skip
        s.hard_acted += bool(plans)
        cordoned = [p for p in plans if p["cordoned_ms"] is not None]
        if cordoned:
            s.hard_cordoned += 1
            first = min(cordoned, key=lambda p: p["cordoned_ms"])
            s.cordon_delays_s.append(max(first["cordoned_ms"] - f["start_ms"], 0) / 1000)
            if first["drained_ms"] is not None:
                s.drain_delays_s.append(max(first["drained_ms"] - f["start_ms"], 0) / 1000)


def _prediction(
    s: Summary, rec: Record, rules: Rules, failures: dict[str, dict[str, Any]], healthy: list[str]
) -> None:
    threshold = rules.prediction.threshold
    faults = rec.truth["faults"]
    for g in rec.gpus:
        fail = failures.get(g)
        before = [
            (t, p[g]) for t, p in rec.predictions if g in p and (fail is None or t < fail["failure_ms"])
        ]
        # calibrated on the population the model is fitted on (evaluation/train.py): healthy GPUs,
        # and failing ones once their precursor began; a sudden failure has nothing to see
        start = None if fail is None else fail["precursor_start_ms"]
        if fail is None or start is not None:
            s.calibration += [(p, int(fail is not None)) for t, p in before if start is None or t >= start]
        first = next((t for t, p in before if p >= threshold), None)
        if g in healthy:
            top = max((p for _, p in before), default=0.0)
            if top >= 0.1:
                s.misses.append(f"healthy {g} reached p30 {top}: {rec.peaks.get(g)}")
            s.healthy_p30_max = max(s.healthy_p30_max, top)
        if first is not None:
            s.predicted += 1
            s.true_predicted += fail is not None
            if fail is None:
                peak = rec.peaks.get(g)
                kinds = sorted({f["kind"] for f in faults if f["gpu_uuid"] == g})
                s.misses.append(f"false prediction on {g} {kinds}: {peak}")
        if fail is None or fail["precursor_start_ms"] is None:
            continue
        s.with_precursor += 1
        long_lead = fail["failure_ms"] - fail["precursor_start_ms"] >= 48 * HOUR_MS
        s.long_lead += long_lead
        if first is not None:
            lead = (fail["failure_ms"] - first) / HOUR_MS
            s.with_precursor_predicted += 1
            s.leads_h.append(lead)
            if long_lead:
                s.long_lead_predicted += 1
                s.long_leads_h.append(lead)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def calibration(pairs: list[tuple[float, int]]) -> dict[str, Any]:
    """Brier score and a reliability table (per bin: count, mean predicted, observed rate)."""
    if not pairs:
        return {"brier": None, "n": 0, "table": []}
    brier = sum((p - y) ** 2 for p, y in pairs) / len(pairs)
    table = []
    for lo, hi in itertools.pairwise(_BINS):
        inside = [(p, y) for p, y in pairs if lo <= p < hi]
        if inside:
            table.append({"bin": f"{lo:.1f}-{min(hi, 1.0):.1f}", "n": len(inside),
                          "mean_p": sum(p for p, _ in inside) / len(inside),
                          "observed": sum(y for _, y in inside) / len(inside)})  # fmt: skip
    return {"brier": brier, "n": len(pairs), "table": table}


def totals(summaries: list[Summary]) -> dict[str, Any]:
    """The suite's figures over every scenario and seed, with the issue's targets checked."""

    def add(name: str) -> int:
        return sum(getattr(x, name) for x in summaries)

    long_leads = [h for x in summaries for h in x.long_leads_h]
    out: dict[str, Any] = {
        "hard_faults": add("hard_faults"),
        "hard_detected_within_cycle": _ratio(add("hard_within_cycle"), add("hard_faults")),
        "healthy_gpus": add("healthy_gpus"),
        "hot_gpus": add("hot_gpus"),
        "false_unhealthy": add("false_unhealthy"),
        "false_degraded": add("false_degraded"),
        "hot_degraded": add("hot_degraded"),
        "healthy_p30_max": max((x.healthy_p30_max for x in summaries), default=0.0),
        "cleared": _ratio(add("cleared"), add("ended_faults")),
        "fall_off_repeats_inspect": _ratio(add("fall_off_repeats_inspect"), add("fall_off_repeats")),
        "single_app_xid_past_restart": add("single_app_xid_past_restart"),
        "app_xid_bursts_escalated": _ratio(add("app_xid_bursts_escalated"), add("app_xid_bursts")),
        "precision": _ratio(add("true_predicted"), add("predicted")),
        "recall_before_failure": _ratio(add("with_precursor_predicted"), add("with_precursor")),
        "recall_long_lead": _ratio(add("long_lead_predicted"), add("long_lead")),
        "median_lead_h_long": statistics.median(long_leads) if long_leads else None,
        "calibration": calibration([c for x in summaries for c in x.calibration]),
        "remediation_plans": add("plans"),
        "remediation_plans_held_by_breaker": add("plans_held_by_breaker"),
        "healthy_gpus_cordoned": add("healthy_cordoned"),
        "hard_faults_acted_on": _ratio(add("hard_acted"), add("hard_faults")),
        "hard_faults_cordoned": _ratio(add("hard_cordoned"), add("hard_faults")),
        "median_fault_to_cordon_s": _median([d for x in summaries for d in x.cordon_delays_s]),
        "median_fault_to_drain_s": _median([d for x in summaries for d in x.drain_delays_s]),
    }
    out["shared"] = {
        cls: SharedFigures.sum(x.shared.get(cls, SharedFigures()) for x in summaries)
        for cls in SHARED_CLASSES
    }
    jobs = out["shared"]["job"]

    def at_least(value: float | None, bound: float) -> bool | None:
        return None if value is None else value >= bound

    # None: the runs had nothing to measure it on
    out["targets"] = {
        "hard faults detected within one cycle (100%)": at_least(out["hard_detected_within_cycle"], 1.0),
        "0 unhealthy on healthy GPUs, hot included": out["false_unhealthy"] == 0,
        "p30 < 0.1 on every healthy GPU": out["healthy_p30_max"] < 0.1,
        "precision >= 0.9": at_least(out["precision"], 0.9),
        "recall before failure >= 0.8 (precursor >= 48 h ahead)": at_least(out["recall_long_lead"], 0.8),
        "median lead >= 24 h (precursor >= 48 h ahead)": at_least(out["median_lead_h_long"], 24),
        "fall-off repeats escalate to inspect or more": at_least(out["fall_off_repeats_inspect"], 1.0),
        "a single application XID stays at restart_workload": out["single_app_xid_past_restart"] == 0,
        "the remediator takes out no healthy GPU": out["healthy_gpus_cordoned"] == 0,
        "0 GPUs escalated for a job's crash": None if not jobs.faults else jobs.escalated == 0,
        "every job crash is one job finding": None if not jobs.faults else jobs.one_finding == jobs.faults,
    }
    return out

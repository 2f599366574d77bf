"""What several GPUs show together, scored against the mock's truth: job crashes, node and rack faults.

- A job crash (the mock's `job_crash`: the same application XID on every GPU of one job within
  seconds) must be seen as one job finding: exactly one `job_crash` alert episode over the
  cycles from its first XID to two cycles after its last, naming all its GPUs. None of its
  GPUs may be judged degraded or worse on `xid` for it (blamed) or recommended anything past
  `restart_workload` (escalated) while its XIDs can count.
- A node fault (hard faults, a fall off the bus or a hardware XID, on `place_min_gpus` GPUs of
  one host, each within `place_window_s` of the one before) must be one `node_fault` finding
  for the host; a rack fault (the same across two or more hosts of one rack, none of them a
  node fault alone) one `rack_fault` finding. Each GPU keeps its own verdict, but none may be
  recommended more than the same signal gets on one GPU alone: a fault of the place counted
  N times is N GPUs sent for inspection or repair instead of one look at the place.

A GPU with any other fault while a shared one can count is left out of blamed and escalated:
what it shows may be its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from services.scorer.rules_config import Rules
from shared.contract.models_health import LADDER

if TYPE_CHECKING:
    from .run import Record

SHARED_CLASSES = ("job", "node", "rack")
_KIND = {"job": "job_crash", "node": "node_fault", "rack": "rack_fault"}
_ONE_GPU_ACTION = {"fall_off_bus": "reboot_node"}  # what a first fall off the bus gets on one GPU


@dataclass(slots=True)
class SharedFigures:
    faults: int = 0  # episodes in the truth
    one_finding: int = 0  # seen as exactly one finding of their class naming all their GPUs
    gpus: int = 0  # GPUs they touched
    judged: int = 0  # of those, GPUs with no other fault meanwhile (blamed and escalated count these)
    blamed: int = 0  # job: GPUs judged degraded or worse on xid for the crash
    escalated: int = 0  # job: past restart_workload; node, rack: past the one-GPU action

    @staticmethod
    def sum(items: Iterable[SharedFigures]) -> SharedFigures:
        out = SharedFigures()
        for x in items:
            for f in fields(SharedFigures):
                setattr(out, f.name, getattr(out, f.name) + getattr(x, f.name))
        return out


@dataclass(frozen=True, slots=True)
class _Episode:
    scope: str
    key: str  # the job, host or rack
    gpus: frozenset[str]
    start_ms: int
    last_ms: int
    end_ms: int  # when what it did can no longer count
    one_gpu_action: str
    own: frozenset[int]  # its faults' ids in the truth


def _place_episodes(rec: Record, rules: Rules) -> list[_Episode]:
    """Node and rack faults in the truth: hard faults of one place, each close after the one before."""
    c, cycle_ms = rules.correlation, int((rec.score_every_s + rec.poll_s) * 1000)
    hard = []
    for f in rec.truth["faults"]:
        code = f["params"].get("code")
        hardware = (
            f["kind"] == "xid"
            and code is not None
            and getattr(rules.xid.get(int(code)), "xid_class", "") == "hardware"
        )
        if f["kind"] == "fall_off_bus" or hardware:
            action = _ONE_GPU_ACTION.get(f["kind"]) or rules.xid[int(code)].action
            hard.append((f, action))
    out = []
    for scope in ("node", "rack"):
        places: dict[str, list[tuple[dict[str, Any], str]]] = {}
        for f, action in hard:
            place = f["hostname"] if scope == "node" else rec.racks.get(f["hostname"])
            if place is not None:
                places.setdefault(place, []).append((f, action))
        for place, found in places.items():
            found.sort(key=lambda x: x[0]["start_ms"])
            runs: list[list[tuple[dict[str, Any], str]]] = []
            for item in found:
                if runs and item[0]["start_ms"] - runs[-1][-1][0]["start_ms"] <= c.place_window_s * 1000:
                    runs[-1].append(item)
                else:
                    runs.append([item])
            for run in runs:
                gpus = frozenset(f["gpu_uuid"] for f, _ in run)
                hosts = {f["hostname"] for f, _ in run}
                if len(gpus) < c.place_min_gpus or (scope == "rack" and len(hosts) < 2):
                    continue
                if scope == "rack" and any(
                    sum(f["hostname"] == h for f, _ in run) >= c.place_min_gpus for h in hosts
                ):
                    continue  # a node fault with company, scored as the node's
                ends = [f["end_ms"] if f["end_ms"] is not None else rec.end_ms for f, _ in run]
                out.append(_Episode(scope, place, gpus, run[0][0]["start_ms"], run[-1][0]["start_ms"],
                                    max(ends) + cycle_ms, max((a for _, a in run), key=LADDER.index),
                                    frozenset(f["id"] for f, _ in run)))  # fmt: skip
    return out


def _job_episodes(rec: Record, rules: Rules) -> list[_Episode]:
    cycle_ms = int((rec.score_every_s + rec.poll_s) * 1000)
    return [
        _Episode(
            "job",
            c["job"],
            frozenset(c["gpus"]),
            c["start_ms"],
            c["last_ms"],
            c["last_ms"] + int(rules.xid_clear_s(c["code"]) * 1000) + cycle_ms,
            "restart_workload",
            frozenset(f["id"] for f in rec.truth["faults"] if f.get("job_crash") == c["id"]),
        )
        for c in rec.truth.get("job_crashes", [])
    ]


def _others_meanwhile(rec: Record, e: _Episode) -> set[str]:
    """The episode's GPUs with a fault of their own that may still count while it can (a day's reach).

    Other job crashes are not theirs: a job that crashes again must not escalate its GPUs either."""
    return {
        f["gpu_uuid"] for f in rec.truth["faults"]
        if f["gpu_uuid"] in e.gpus and f["id"] not in e.own and f.get("job_crash") is None
        and f["kind"] != "heavy_workload" and f["start_ms"] <= e.end_ms
        and (f["end_ms"] is None or f["end_ms"] + 86_400_000 >= e.start_ms)
    }  # fmt: skip


def _ms(stamp: str) -> int:
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    except ValueError:
        return -1


def shared_figures(rec: Record, rules: Rules, misses: list[str]) -> dict[str, SharedFigures]:
    cycle_ms = int((rec.score_every_s + rec.poll_s) * 1000)
    c = rules.correlation
    # XIDs are stamped with the poll that saw them: a crash's first may come a poll after its start
    window_ms = {"job": int((c.job_window_s + rec.poll_s) * 1000)}
    window_ms["node"] = window_ms["rack"] = int((c.place_window_s + rec.poll_s) * 1000)
    out = {cls: SharedFigures() for cls in SHARED_CLASSES}
    for e in _job_episodes(rec, rules) + _place_episodes(rec, rules):
        x = out[e.scope]
        x.faults += 1
        x.gpus += len(e.gpus)
        # findings of this episode: its kind, its GPUs, first seen within its span (an earlier crash
        # of the same job, still in reach, is that crash's finding)
        lo, hi = e.start_ms - window_ms[e.scope], e.last_ms + window_ms[e.scope]
        # one finding may grow over cycles (its GPUs' XIDs seen a poll apart): it is its key and first
        seen: dict[tuple[str, str], int] = {}
        for t, found in rec.findings:
            for kind, key, first, count, gpus in found:
                if (e.start_ms <= t <= e.last_ms + 2 * cycle_ms and kind == _KIND[e.scope]
                        and e.gpus & set(gpus) and lo <= _ms(first) <= hi):  # fmt: skip
                    seen[(key, first)] = max(seen.get((key, first), 0), count)
        one = len(seen) == 1 and max(seen.values()) == len(e.gpus)
        x.one_finding += one
        if not one:
            misses.append(
                f"{e.scope} {e.key} ({len(e.gpus)} GPUs) at {e.start_ms}: seen as {sorted(seen.items())}"
            )
        judged = e.gpus - _others_meanwhile(rec, e)
        x.judged += len(judged)
        for gpu in sorted(judged):
            cycles = [(states, actions) for t, states, actions in rec.cycles if e.start_ms <= t <= e.end_ms]
            worst = max((LADDER.index(a.get(gpu, "none")) for _, a in cycles), default=0)
            if e.scope == "job" and any(s.get(gpu, {}).get("xid", "healthy") != "healthy" for s, _ in cycles):
                x.blamed += 1
                misses.append(f"job {e.key}: {gpu} judged on xid for the job's crash")
            if worst > LADDER.index(e.one_gpu_action):
                x.escalated += 1
                misses.append(
                    f"{e.scope} {e.key}: {gpu} escalated to {LADDER[worst]} (one GPU: {e.one_gpu_action})"
                )
    return out

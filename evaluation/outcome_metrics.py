"""Decisions scored against outcomes: from what happened to each fault and node to the figures per class.

A run (one arm: the remediator, or a baseline) is told as a `Timeline`: its
incidents (the faults that were one event, their true start and end, the
mock's ground truth), when each node was out of service (cordoned, and by
whom it came back), the pods evicted, a person's visits, and every return of
a node that still had an active fault. Per incident:

- back: the first moment, once every fault of the incident has ended, that
  its nodes are in service (not cordoned); none when that never happened in
  the run (the time out of service then runs to its end, and is counted so);
- time out of service: back minus the fault's start;
- returned automatically: back, with no person's visit to its nodes between
  the fault and then.

Evictions, visits, healthy nodes taken out (a cordon while no fault was active
on the node and no incident of a broken GPU on it was still open: a GPU that
falls off again and again is broken between its falls) and returns of a
faulty node are charged to the incident of that node open at the time (else
its last one before; else to no class). Node-hours
out of service are, per node, the time it was cordoned or had an active fault.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HOUR = 3600.0
NONE_CLASS = "none"
HEALTHY_CLASSES = frozenset({"job"})  # a job's crash is the job's: its GPUs are healthy


@dataclass(slots=True)
class Incident:
    id: int
    cls: str
    nodes: tuple[str, ...]
    start_s: float
    faults: list[tuple[float, float | None]]  # (start, end) of each of its faults; end None: never ended


@dataclass(slots=True)
class Timeline:
    arm: str
    start_s: float
    end_s: float
    incidents: list[Incident]
    # node -> [(cordoned at, back at | None, by: "remediator" | "person" | None)]
    out: dict[str, list[tuple[float, float | None, str | None]]] = field(default_factory=dict)
    evictions: list[tuple[float, str, int, int]] = field(default_factory=list)  # (at, node, pods, jobs)
    visits: list[tuple[float, str, str]] = field(default_factory=list)  # (at, node, what)
    faulty_returns: list[tuple[float, str]] = field(default_factory=list)  # (at, node)
    faults_by_node: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    remedies: list[dict[str, Any]] = field(default_factory=list)  # the mock's ground truth of each remedy


@dataclass(slots=True)
class ClassFigures:
    faults: int = 0
    automatic: int = 0
    within_15min: int = 0
    never_back: int = 0
    out_s: list[float] = field(default_factory=list)
    faulty_returns: int = 0
    healthy_out: int = 0
    pods: int = 0
    jobs: int = 0
    people: int = 0

    @property
    def median_min(self) -> float | None:
        return statistics.median(self.out_s) / 60 if self.out_s else None

    @property
    def p95_min(self) -> float | None:
        return percentile(self.out_s, 0.95) / 60 if self.out_s else None


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile by the nearest rank (no interpolation: a value some fault really had)."""
    ordered = sorted(xs)
    rank = max(1, -(-int(q * 1000) * len(ordered) // 1000))
    return ordered[min(rank, len(ordered)) - 1]


def cordoned_at(timeline: Timeline, node: str, t: float) -> bool:
    return any(a <= t and (b is None or t < b) for a, b, _ in timeline.out.get(node, []))


def back_at(timeline: Timeline, incident: Incident) -> float | None:
    """When the incident's nodes were first in service again with every fault of it over; None: never."""
    ends = [end for _, end in incident.faults]
    if any(end is None for end in ends):
        return None
    t = max([incident.start_s, *(e for e in ends if e is not None)])
    for node in incident.nodes:
        for a, b, _ in sorted(timeline.out.get(node, [])):
            if a <= t and (b is None or t < b):
                if b is None:
                    return None
                t = b
    return t if t <= timeline.end_s else None


def _owner(timeline: Timeline, backs: dict[int, float | None], node: str, t: float) -> Any:
    """The incident on `node` open at t, else its last one before t; None when there is none."""
    mine = [i for i in timeline.incidents if node in i.nodes and i.start_s <= t]
    open_ = [i for i in mine if (backs[i.id] or timeline.end_s) >= t]
    pick = open_ or mine
    return max(pick, key=lambda i: i.start_s) if pick else None


def figures(timeline: Timeline, classes: Iterable[str]) -> dict[str, ClassFigures]:
    """Per class (and `none` for what no incident explains) the figures the module docstring defines."""
    out = {cls: ClassFigures() for cls in [*classes, NONE_CLASS]}
    backs = {i.id: back_at(timeline, i) for i in timeline.incidents}
    for incident in timeline.incidents:
        x = out.setdefault(incident.cls, ClassFigures())
        x.faults += 1
        back = backs[incident.id]
        x.out_s.append((back if back is not None else timeline.end_s) - incident.start_s)
        if back is None:
            x.never_back += 1
            continue
        visited = any(n in incident.nodes and incident.start_s <= at <= back for at, n, _ in timeline.visits)
        if not visited:
            x.automatic += 1
            x.within_15min += back - incident.start_s <= 15 * 60

    def charge(node: str, t: float) -> ClassFigures:
        owner = _owner(timeline, backs, node, t)
        return out[owner.cls] if owner is not None else out[NONE_CLASS]

    for at, node, pods, jobs in timeline.evictions:
        x = charge(node, at)
        x.pods += pods
        x.jobs += jobs
    for at, node, _ in timeline.visits:
        charge(node, at).people += 1
    for at, node in timeline.faulty_returns:
        charge(node, at).faulty_returns += 1
    for node, spans in timeline.out.items():
        for a, _, _ in spans:
            faults = timeline.faults_by_node.get(node, [])
            broken = [i for i in timeline.incidents if node in i.nodes and i.cls not in HEALTHY_CLASSES
                      and i.start_s <= a <= (backs[i.id] or timeline.end_s)]  # fmt: skip
            if not broken and not any(s <= a and (e is None or a < e) for s, e in faults):
                charge(node, a).healthy_out += 1
    return out


def node_hours(timeline: Timeline) -> float:
    """Per node, the time it was cordoned or had an active fault, summed, in hours (up to the run's end)."""
    total = 0.0
    nodes = set(timeline.out) | set(timeline.faults_by_node)
    for node in nodes:
        spans = [(a, b if b is not None else timeline.end_s) for a, b, _ in timeline.out.get(node, [])]
        spans += [
            (s, e if e is not None else timeline.end_s) for s, e in timeline.faults_by_node.get(node, [])
        ]
        total += _union([(max(a, timeline.start_s), min(b, timeline.end_s)) for a, b in spans])
    return total / HOUR


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= a:
            continue
        if a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def remedy_outcomes(timeline: Timeline, classes: Iterable[str] = ("reset", "flaky")) -> dict[str, float]:
    """What the lifecycle engine assumes of a reset (services/lifecycle/settings.py), as this run saw it:
    how often a GPU reset ended every fault of the GPU for good (no fault left, none drawn to come back),
    first on a GPU not reset in the 30 days before, then on one that was; and how long a reset-fixable
    fault kept its node out of service when it came back automatically (median, hours). A figure with
    nothing to measure it is left out."""
    out: dict[str, float] = {}
    last: dict[str, float] = {}
    fresh: list[bool] = []
    again: list[bool] = []
    for r in sorted(timeline.remedies, key=lambda r: r["time_ms"]):
        if r["remedy"] != "reset_gpu" or not r["ok"] or not r["faults_ended"]:
            continue
        held = not r["faults_left"] and not r["recurrences"]
        at = r["time_ms"] / 1000
        before = [last.get(u) for u in r["gpu_uuids"]]
        (again if any(b is not None and at - b <= 30 * 86400 for b in before) else fresh).append(held)
        last.update(dict.fromkeys(r["gpu_uuids"], at))
    if fresh:
        out["reset_fix_probability"] = sum(fresh) / len(fresh)
    if again:
        out["reset_fix_probability_after_reset"] = sum(again) / len(again)
    got = figures(timeline, classes)
    back = [
        b - i.start_s
        for i in timeline.incidents
        if i.cls in set(classes)
        and (b := back_at(timeline, i)) is not None
        and not any(n in i.nodes and i.start_s <= at <= b for at, n, _ in timeline.visits)
    ]
    if back and any(got[c].automatic for c in classes):
        out["reset_downtime_h"] = statistics.median(back) / HOUR
    return out

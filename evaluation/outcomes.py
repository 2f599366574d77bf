"""`python -m evaluation.outcomes` (`make evaluate`): the remediator's decisions scored against what happened.

Each seed's simulated week (evaluation/outcome_world.py: reset-fixable,
reboot-fixable, persistent, flaky, job and place faults) runs four ways on the
same faults:

- `remediator`: the real scorer judges the fleet every simulated minute, after
  each minute's poll, and the real remediator runs live on the
  simulation's clock, through a scheduler standing in (`SimScheduler`) and the
  mock fleet's own reset, reboot and compute check (`SimNodeExec`), with the
  committed policy (the breaker's and the cap's shares opened to the small fleet, as in
  evaluation/remediation.py). A person (`Person`: within 4 working hours)
  approves what waits for approval, and repairs a node left out for a person
  and marks its GPUs repaired (the remediator then validates it and returns it);
- `loop open`: the same, but no remedy resolves anything (the remediator's
  `gpu_remedies` rows are taken away after each look): the remediator as it
  was before #40;
- `cordon-and-wait`: each fault's node cordoned as soon as the remediator
  cordons (its median delay in the `remediator` run), then a person, who
  drains, remedies what the ground truth says and returns the node;
- `no automation`: a person, paged by the alert (2 minutes after the fault),
  acts within 4 working hours: drains, remedies and returns.

The two baselines replay their person's remedies on a fresh mock fleet of the
same seed and faults (`replay`), so flaky faults come back by the mock's own
draws. A person's remedy takes 10 minutes (a reset), 15 (a reboot) or 2 hours
(a repair). evaluation/outcome_metrics.py turns each run into the figures per
class; `render` prints them with the targets.

Simulated time goes minute by minute from each fault, each remedy and each
visit for 10 minutes, and while a plan runs; in between, one poll and one
cycle every 30 simulated minutes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.lifecycle.settings import EconomicsSection
from services.mock_dcgm.fleet import Fleet, FleetSpec, SimClock
from services.remediator.decide import decide
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap, from_verdict
from services.remediator.policy import Policy, load_policy
from services.remediator.steps import Steps
from services.scorer.rules_config import DEFAULT_RULES, Rules, load_rules
from shared.config import DatabaseSettings, Settings
from shared.db import connect
from shared.migrate import migrated_schema
from shared.models_health import HealthVerdict
from shared.store import remediation as store
from shared.store import repairs

from .feed import SimFeed
from .outcome_metrics import ClassFigures, Incident, Timeline, figures, node_hours, remedy_outcomes
from .outcome_world import (
    CLASSES,
    OutcomeScenario,
    Person,
    SimNodeExec,
    SimScheduler,
    monday_before,
    outcome_scenario,
)

log = logging.getLogger(__name__)

SEEDS = (301,)
FINE_S, COARSE_S, SCORE_S, BUSY_S = 60.0, 1800.0, 60.0, 600.0
WORK_S = {"reset_gpu": 600.0, "reboot_node": 900.0, "repair": 7200.0}
ALERT_S = 120.0  # no automation: the page reaches a person this long after the fault
ARMS = ("remediator", "loop open", "cordon-and-wait", "no automation")
# what the lifecycle engine assumes of a reset (EconomicsSection), as the remediator's runs measure it
REMEDY_FIGURES = ("reset_fix_probability", "reset_fix_probability_after_reset", "reset_downtime_h")


def _fleet(oscen: OutcomeScenario, seed: int, start_s: float, clock: Any) -> Fleet:
    sc = oscen.scenario
    spec = FleetSpec(nodes=sc.nodes, gpus_per_node=sc.gpus_per_node, models=tuple(sc.models), seed=seed)
    return Fleet(spec, SimClock(start_s=start_s, monotonic=clock))


def _inject(fleet: Fleet, oscen: OutcomeScenario) -> dict[int, tuple[str, int]]:
    """Every fault of the scenario into the fleet: mock fault id -> (class, incident)."""
    owner: dict[int, tuple[str, int]] = {}
    for request, cls, incident in zip(oscen.scenario.faults, oscen.classes, oscen.incidents, strict=True):
        before = {f.id for n in fleet.nodes for g in n.gpus for f in g.faults}
        fleet.inject(dict(request))
        for fault in (f for n in fleet.nodes for g in n.gpus for f in g.faults if f.id not in before):
            owner[fault.id] = (cls, incident)
    return owner


def timeline_of(
    arm: str, fleet: Fleet, owner: dict[int, tuple[str, int]], start_s: float, end_s: float,
    sched: SimScheduler, visits: list[tuple[float, str, str]], faulty_returns: list[tuple[float, str]],
) -> Timeline:  # fmt: skip
    """The run told for the accounting: incidents from the mock's ground truth (each recurrence of a flaky
    fault its own; a persistent fault's recurrences part of it), the scheduler's spans and evictions."""
    truth = fleet.ground_truth()
    by_id = {f["id"]: f for f in truth["faults"]}
    next_id = max((i for _, i in owner.values()), default=0) + 1
    groups: dict[int, Incident] = {}
    faults_by_node: dict[str, list[tuple[float, float | None]]] = {}
    for f in truth["faults"]:
        root, hops = f, 0
        while root["recurrence_of"] is not None and root["id"] not in owner and hops < 1000:
            root, hops = by_id[root["recurrence_of"]], hops + 1
        cls, incident = owner.get(root["id"], ("none", -1))
        if f["id"] not in owner and cls != "persistent":  # a flaky fault's recurrence: a fault of its own
            incident, next_id = next_id, next_id + 1
        span = (f["start_ms"] / 1000, None if f["end_ms"] is None else f["end_ms"] / 1000)
        if span[0] >= end_s:
            continue
        group = groups.setdefault(incident, Incident(incident, cls, (), span[0], []))
        group.nodes = tuple(sorted({*group.nodes, f["hostname"]}))
        group.start_s = min(group.start_s, span[0])
        group.faults.append(span)
        if f["job_crash"] is None:
            faults_by_node.setdefault(f["hostname"], []).append(span)
    remedies = [r for r in truth["remedies"] if r["time_ms"] / 1000 < end_s]
    out = {node: [(a, b, by) for a, b, by in spans] for node, spans in sched.spans.items()}
    return Timeline(arm=arm, start_s=start_s, end_s=end_s, incidents=list(groups.values()), out=out,
                    evictions=list(sched.evictions), visits=visits, faulty_returns=faulty_returns,
                    faults_by_node=faults_by_node, remedies=remedies)  # fmt: skip


def faulty(fleet: Fleet, hostname: str, now: float) -> bool:
    """Whether a GPU of the node has an active fault (a job's crash is the job's, not the GPU's)."""
    return any(
        f.active(now) and f.job_crash is None for n in fleet.nodes if n.hostname == hostname for g in n.gpus
        for f in g.faults
    )  # fmt: skip


class Arm:
    """One simulated run of the remediator, live, on the simulation's clock (`loop_closed` False: no remedy
    resolves anything)."""

    def __init__(self, db: DatabaseSettings, oscen: OutcomeScenario, seed: int, rules: Rules, *,
                 loop_closed: bool, start_s: float, policy: Policy | None = None) -> None:  # fmt: skip
        committed = policy or load_policy()
        self.policy = committed.model_copy(  # the breaker's and the cap's shares opened to the small fleet
            update={
                "breaker": committed.breaker.model_copy(update={"max_fleet_percent": 100.0}),
                "nodes_out": committed.nodes_out.model_copy(update={"max_fleet_percent": 100.0}),
            }
        )
        self.db, self.oscen, self.rules, self.loop_closed = db, oscen, rules, loop_closed
        sc = oscen.scenario
        spec = FleetSpec(nodes=sc.nodes, gpus_per_node=sc.gpus_per_node, models=tuple(sc.models), seed=seed)
        self.feed = SimFeed(db, spec, start_s=start_s, rules=rules)
        self.fleet = self.feed.fleet
        self.owner = _inject(self.fleet, oscen)
        self.sched = SimScheduler(self.fleet, self.now_s)
        steps = Steps(policy=self.policy, schedulers=[self.sched], node_exec=SimNodeExec(self.fleet),
                      nodes=NodeMap(), look_s=FINE_S)  # fmt: skip
        self.executor = Executor(db=db, policy=self.policy, steps=steps, dry_run=False, retry_s=FINE_S,
                                 clock=self.now)  # fmt: skip
        self.person = Person(seed)
        self.due: list[tuple[float, int, str, str]] = []  # (when, plan or 0, node, what)
        self.asked: set[tuple[int, str]] = set()
        self.visits: list[tuple[float, str, str]] = []
        self.faulty_returns: list[tuple[float, str]] = []
        self.last_event = start_s
        self.conn = connect(db)

    def now_s(self) -> float:
        return self.fleet.clock.now()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.now_s(), UTC)

    def run(self, hours: float) -> Timeline:
        start = self.now_s()
        end = start + hours * 3600
        last_score = float("-inf")
        t = start
        while t < end:
            starts = [f.start_s for n in self.fleet.nodes for g in n.gpus for f in g.faults]
            busy = (
                t - self.last_event < BUSY_S or any(t - BUSY_S <= s <= t for s in starts) or self._running()
            )
            upcoming = [s for s in starts if s > t] + [d[0] for d in self.due]
            nxt = t + (FINE_S if busy else COARSE_S)
            if not busy and upcoming and min(upcoming) < nxt:  # the first poll on the fine grid after it
                nxt = start + (int((min(upcoming) - start) // FINE_S) + 1) * FINE_S
            t = min(nxt, end)
            self._people(t)
            self.feed.hand.t = t - start
            self.feed.poll()
            self.feed.last_poll_s = t
            if busy and t - last_score < SCORE_S - 1e-6:
                continue
            last_score = t
            result = self.feed.score(predict=False)
            for _kind, _key, message in result.messages:
                if isinstance(message, HealthVerdict):
                    finding = from_verdict(message, "gpu-health")
                    decide(
                        self.conn, finding, policy=self.policy, nodes=NodeMap(), dry_run=False, now=self.now()
                    )
                    self.conn.commit()
            self._step()
            self._ask()
        name = "remediator" if self.loop_closed else "loop open"
        return timeline_of(
            name, self.fleet, self.owner, start, end, self.sched, self.visits, self.faulty_returns
        )

    def _running(self) -> bool:
        row = self.conn.execute("SELECT count(*) FROM remediations WHERE state = 'running' AND NOT dry_run")
        (n,) = row.fetchone() or (0,)
        self.conn.commit()
        return bool(n)

    def _step(self) -> None:
        """Every due plan as far as it goes now; the returns it made are checked against the ground truth."""
        cordoned = {n for n, s in self.sched.nodes.items() if s.cordoned_at is not None}
        for _ in range(20):
            done = self.executor.run_due()
            if not self.loop_closed:
                self._open_loop()
            if not done:
                break
            self.last_event = self.now_s()
        for node in cordoned:
            if not self.sched.cordoned(node) and faulty(self.fleet, node, self.now_s()):
                self.faulty_returns.append((self.now_s(), node))

    def _open_loop(self) -> None:
        """The loop as it was before #40: no remedy of the remediator's resolves anything in the scorer."""
        (exists,) = self.conn.execute("SELECT to_regclass('gpu_remedies') IS NOT NULL").fetchone() or (False,)
        if exists:
            self.conn.execute("DELETE FROM gpu_remedies WHERE source = 'remediator'")
        self.conn.commit()

    def _ask(self) -> None:
        """A person is needed for each plan held, and for each node left out for a person."""
        now, conn = self.now_s(), self.conn
        held = conn.execute(
            "SELECT id, node FROM remediations WHERE state = 'held' AND NOT dry_run"
        ).fetchall()
        for plan, host in held:
            plan_id, node = int(str(plan)), str(host)
            if (plan_id, "approve") not in self.asked:
                self.asked.add((plan_id, "approve"))
                heapq.heappush(
                    self.due, (self.person.due(now, f"{node}:{plan_id}"), plan_id, node, "approve")
                )
        for node in [n for n, s in self.sched.nodes.items() if s.cordoned_at is not None]:
            left = store.left_out_for_a_person(conn, node, False)
            if left is not None and store.active_plan(conn, node, False) is None:
                key = (int(left["id"]), "repair")
                if key not in self.asked:
                    self.asked.add(key)
                    heapq.heappush(
                        self.due, (self.person.due(now, f"{node}:{left['id']}:r"), 0, node, "visit")
                    )
        conn.commit()

    def _people(self, t: float) -> None:
        """What a person does that is due by t: approve a held plan; come to a node left out for them and,
        WORK_S["repair"] later, have repaired what the ground truth says is broken and marked its GPUs
        repaired (or returned, where nothing was wrong): the remediator then validates the node and returns
        it (services/remediator/repairs.py), or leaves it for a person again."""
        while self.due and self.due[0][0] <= t:
            at, plan_id, node, what = heapq.heappop(self.due)
            self.feed.hand.t = at - self.fleet.clock.start_s
            self.last_event = at
            if what == "approve":
                if store.approve_plan(self.conn, plan_id, at=self.now(), by="evaluation"):
                    self.visits.append((at, node, what))
                self.conn.commit()
            elif what == "visit" and self.sched.cordoned(node):
                self.visits.append((at, node, what))
                heapq.heappush(self.due, (at + WORK_S["repair"], 0, node, "fixed"))
            elif what == "fixed":
                gpus = [g for n in self.fleet.nodes if n.hostname == node for g in n.gpus]
                broken = [g for g in gpus if any(f.active(at) and f.job_crash is None for f in g.faults)]
                for gpu in broken:
                    self.fleet.repair({"gpu_uuid": gpu.uuid})
                for gpu in gpus:
                    repairs.mark_at(self.conn, gpu.uuid, kind="repaired" if gpu in broken else "returned",
                                    by="evaluation", note="the person's visit", at=self.now())  # fmt: skip
                self.conn.commit()  # the remediator answers the marks: it validates the node and returns it

    def close(self) -> None:
        self.conn.close()
        self.executor.close()
        self.feed.close()


@dataclass(slots=True)
class ArmResult:
    arm: str
    seed: int
    figures: dict[str, ClassFigures]
    node_hours: float
    wall_s: float
    remedies: dict[str, float]  # what the lifecycle engine assumes of a reset, as this run saw it
    timeline: Timeline | None = None  # what happened (--json keeps it, to see why a figure is what it is)


def replay(arm: str, oscen: OutcomeScenario, seed: int, start_s: float, *,
           cordon_after_s: float | None = None) -> Timeline:  # fmt: skip
    """A baseline on a fresh mock fleet: a person paged ALERT_S after each fault (with `cordon_after_s`: the
    node cordoned that long after it, the remediator's median, and the person paged then) arrives within 4
    working hours, drains, does what the ground truth says the node's active faults need (reset, reboot,
    repair: the largest; a repair for a GPU whose fault came back twice after a remedy), and returns it."""
    clock = _Hand()
    fleet = _fleet(oscen, seed, start_s, clock)
    owner = _inject(fleet, oscen)
    sched = SimScheduler(fleet, fleet.clock.now)
    person = Person(seed)
    end = start_s + oscen.scenario.hours * 3600
    visits: list[tuple[float, str, str]] = []
    queue: list[tuple[float, str, str]] = []
    paged: set[int] = set()
    busy_until: dict[str, float] = {}
    while True:
        faults = [
            f
            for n in fleet.nodes
            for g in n.gpus
            for f in g.faults
            if f.id not in paged and f.job_crash is None
        ]
        for f in faults:
            paged.add(f.id)
            node = fleet.nodes[f.node].hostname
            needed = f.start_s + (ALERT_S if cordon_after_s is None else cordon_after_s)
            if cordon_after_s is not None:
                heapq.heappush(queue, (needed, node, "cordon"))
            due = max(person.due(needed, f"{node}:{f.id}"), busy_until.get(node, 0.0))
            heapq.heappush(queue, (due, node, "visit"))
        if not queue:
            break
        at, node, what = heapq.heappop(queue)
        if at >= end:
            break
        clock.t = at - start_s
        gpus = [g for n in fleet.nodes if n.hostname == node for g in n.gpus]
        active = [f for g in gpus for f in g.faults if f.active(at) and f.job_crash is None]
        if what == "cordon":
            if active:
                sched.cordon(node, by_remediator=True)
            continue
        if not active and not sched.cordoned(node):
            continue  # over before anyone came (or already seen to)
        visits.append((at, node, what))
        sched.cordon(node, by_remediator=False)
        sched.evict(node)
        need = max((_need(f, fleet) for f in active), key=list(WORK_S).index, default="reset_gpu")
        clock.t += WORK_S[need]
        for gpu in {(f.node, f.gpu): fleet.nodes[f.node].gpus[f.gpu] for f in active}.values():
            if need == "repair":
                fleet.repair({"gpu_uuid": gpu.uuid})
            elif need == "reset_gpu":
                fleet.remedy("reset_gpu", {"gpu_uuid": gpu.uuid})
        if need == "reboot_node":
            fleet.remedy("reboot_node", {"node": node})
        sched.uncordon(node, by="person")
        busy_until[node] = fleet.clock.now()
    return timeline_of(arm, fleet, owner, start_s, end, sched, visits, [])


def _need(fault: Any, fleet: Fleet) -> str:
    """What a person does about a fault: what ends it, or a repair once it came back twice after a remedy."""
    hops, at = 0, fault
    by_id = {f.id: f for n in fleet.nodes for g in n.gpus for f in g.faults}
    while at.recurrence_of is not None and hops < 100:
        at, hops = by_id[at.recurrence_of], hops + 1
    return "repair" if hops >= 2 else str(fault.fixed_by)


class _Hand:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def cordon_delay(timeline: Timeline) -> float | None:
    """The median time from a fault to the remediator's first cordon of its node (None: it cordoned none)."""
    delays = []
    for i in timeline.incidents:
        firsts = [a for n in i.nodes for a, _, _ in timeline.out.get(n, []) if i.start_s <= a]
        if firsts:
            delays.append(min(firsts) - i.start_s)
    return statistics.median(delays) if delays else None


@contextmanager
def _arm(db: DatabaseSettings, oscen: OutcomeScenario, seed: int, rules: Rules, *, loop_closed: bool,
         start_s: float, policy: Policy | None = None) -> Iterator[Arm]:  # fmt: skip
    with migrated_schema(db, "outcomes") as scoped:
        arm = Arm(scoped, oscen, seed, rules, loop_closed=loop_closed, start_s=start_s, policy=policy)
        try:
            yield arm
        finally:
            arm.close()


def run_seed(
    db: DatabaseSettings,
    seed: int,
    rules: Rules,
    *,
    days: float = 7.0,
    arms: tuple[str, ...] = ARMS,
    policy: Policy | None = None,
) -> list[ArmResult]:
    """The arms asked for on one seed's week, the simulated ones each in a throwaway schema (cordon-and-wait
    follows the remediator's cordons: it needs that arm)."""
    oscen = outcome_scenario(seed, days=days)
    start_s = monday_before(time.time() - oscen.scenario.hours * 3600 - 7 * 86400) + 17.5
    results: list[ArmResult] = []
    timelines: dict[str, Timeline] = {}
    for name, closed in (("remediator", True), ("loop open", False)):
        if name not in arms and not (name == "remediator" and "cordon-and-wait" in arms):
            continue
        began = time.perf_counter()
        with _arm(db, oscen, seed, rules, loop_closed=closed, start_s=start_s, policy=policy) as arm:
            timelines[name] = arm.run(oscen.scenario.hours)
        results.append(ArmResult(name, seed, figures(timelines[name], CLASSES), node_hours(timelines[name]),
                                 time.perf_counter() - began, remedy_outcomes(timelines[name]),
                                 timelines[name]))  # fmt: skip
    for name in ("cordon-and-wait", "no automation"):
        if name not in arms:
            continue
        began = time.perf_counter()
        delay = cordon_delay(timelines["remediator"]) if name == "cordon-and-wait" else None
        timelines[name] = replay(name, oscen, seed, start_s, cordon_after_s=delay)
        results.append(ArmResult(name, seed, figures(timelines[name], CLASSES), node_hours(timelines[name]),
                                 time.perf_counter() - began, remedy_outcomes(timelines[name]),
                                 timelines[name]))  # fmt: skip
    return results


def load_results(path: Path) -> list[ArmResult]:
    """Results written by --json (of runs split over processes: --arms)."""
    return [
        ArmResult(
            r["arm"],
            r["seed"],
            {c: ClassFigures(**x) for c, x in r["figures"].items()},
            r["node_hours"],
            r["wall_s"],
            r["remedies"],
        )
        for r in json.loads(path.read_text())
    ]


def merged(results: list[ArmResult]) -> dict[str, tuple[dict[str, ClassFigures], float]]:
    """Per arm, its figures over every seed (class by class) and its node-hours."""
    out: dict[str, tuple[dict[str, ClassFigures], float]] = {}
    for r in results:
        mine, hours = out.get(r.arm, ({}, 0.0))
        for cls, x in r.figures.items():
            into = mine.setdefault(cls, ClassFigures())
            for name in ("faults", "automatic", "within_15min", "never_back", "faulty_returns", "healthy_out",
                         "pods", "jobs", "people"):  # fmt: skip
                setattr(into, name, getattr(into, name) + getattr(x, name))
            into.out_s += x.out_s
        out[r.arm] = (mine, hours + r.node_hours)
    return out


def _min(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f} min" if x < 120 else f"{x / 60:.1f} h"


def targets(by_arm: dict[str, tuple[dict[str, ClassFigures], float]]) -> dict[str, bool]:
    mine, hours = by_arm["remediator"]
    reset = mine["reset"]
    return {
        ">= 95 % of reset-fixable faults back in service automatically within 15 min":
            reset.faults > 0 and reset.within_15min >= 0.95 * reset.faults,
        "0 nodes returned with their fault still there": sum(x.faulty_returns for x in mine.values()) == 0,
        "node-hours out of service <= 25 % of no automation's": hours <= 0.25 * by_arm["no automation"][1],
    }  # fmt: skip


def render(results: list[ArmResult]) -> str:
    by_arm = merged(results)
    seeds = sorted({r.seed for r in results})
    lines = [
        f"the remediator's decisions against what happened: seeds {seeds}, 8 nodes x 2 GPUs each",
        "per class: faults, back in service automatically (within 15 min), never back in the run,",
        "median / p95 time out of service, nodes returned still faulty, healthy nodes taken out,",
        "pods evicted and jobs disrupted per fault, a person needed",
        f"  {'arm':<16}{'class':<11}{'faults':>7}{'auto':>6}{'<=15m':>7}{'never':>6}{'median':>9}{'p95':>9}"
        f"{'faulty':>7}{'healthy':>8}{'pods/f':>7}{'jobs/f':>7}{'person':>7}",
    ]
    for arm in ARMS:
        mine, _ = by_arm[arm]
        for cls in [*CLASSES, "none"]:
            x = mine.get(cls)
            if x is None or not (x.faults or x.healthy_out or x.people or x.pods):
                continue
            per = max(x.faults, 1)
            lines.append(
                f"  {arm:<16}{cls:<11}{x.faults:>7}{x.automatic:>6}{x.within_15min:>7}{x.never_back:>6}"
                f"{_min(x.median_min):>9}{_min(x.p95_min):>9}{x.faulty_returns:>7}{x.healthy_out:>8}"
                f"{x.pods / per:>7.1f}{x.jobs / per:>7.1f}{x.people:>7}"
            )
    base = by_arm["no automation"][1]
    lines.append("\nnode-hours out of service (cordoned, or with an active fault), against no automation's:")
    for arm in ARMS:
        hours = by_arm[arm][1]
        lines.append(f"  {arm:<16}{hours:>9.1f} h{hours / base if base else 0:>8.0%}")
    for name, ok in targets(by_arm).items():
        lines.append(f"  [{'ok' if ok else 'MISSED'}] {name}")
    seen = seen_remedies(results)
    lines.append(
        "\nwhat the lifecycle engine reads of a reset, as the remediator's runs saw it (its defaults):"
    )
    defaults = EconomicsSection()
    for name in REMEDY_FIGURES:
        value, default = seen.get(name), getattr(defaults, name)
        lines.append(f"  {name:<36}{'-' if value is None else f'{value:.3f}':>8}   ({default})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.outcomes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--days", type=float, default=7.0, help="simulated days per seed (at least 2)")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    parser.add_argument("--policy", type=Path, help="the remediator's policy (default: the committed one)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="run only these arms")
    parser.add_argument("--render", type=Path, nargs="+", help="print the results of earlier --json runs")
    parser.add_argument(
        "--remedy-outcomes", type=Path,
        help="write what the remediator's resets did (for python -m evaluation.lifecycle --remedy-outcomes)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.days < 2:
        parser.error("--days must be at least 2")
    if args.render:
        results = [r for path in args.render for r in load_results(path)]
    else:
        rules, db = load_rules(args.rules), Settings().db
        arms, policy = tuple(args.arms), load_policy(args.policy) if args.policy else None
        results = [r for seed in args.seeds
                   for r in run_seed(db, seed, rules, days=args.days, arms=arms, policy=policy)]  # fmt: skip
    if {r.arm for r in results} >= set(ARMS):
        print(render(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.remedy_outcomes:
        args.remedy_outcomes.write_text(json.dumps(seen_remedies(results), indent=1))
    return 0


def seen_remedies(results: list[ArmResult]) -> dict[str, float]:
    """The remediator's runs' remedy outcomes, each figure the mean over the seeds that measured it."""
    out: dict[str, list[float]] = {}
    for r in results:
        if r.arm == "remediator":
            for name, value in r.remedies.items():
                out.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in out.items()}


if __name__ == "__main__":
    sys.exit(main())

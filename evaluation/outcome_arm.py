"""One simulated run of the live remediator (evaluation/outcomes.py), and the ground truth as a timeline.

`Arm` drives a mock fleet through the collector's parsing and the sink's
writer into a throwaway schema, judges it with the real scorer, and runs the
real remediator live on the simulation's clock (evaluation/outcome_world.py's
scheduler and exec driver), with a person who approves what is held and
repairs what is left out for them. `timeline_of` tells what happened for the
accounting (evaluation/outcome_metrics.py). `replay` runs the baselines: a
person on a fresh mock fleet of the same seed and faults, no database.
"""

from __future__ import annotations

import heapq
import statistics
from datetime import UTC, datetime
from typing import Any

from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.remediator.decide import decide
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap, from_verdict
from services.remediator.policy import Policy, load_policy
from services.remediator.steps import Steps
from services.scorer.rules_config import Rules
from shared.contract.models_health import HealthVerdict
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import remediation as store
from shared.store import remedies, repairs

from .feed import SimFeed
from .outcome_metrics import Incident, Timeline
from .outcome_world import OutcomeScenario, Person, SimNodeExec, SimScheduler

FINE_S, COARSE_S, SCORE_S, BUSY_S = 60.0, 1800.0, 60.0, 600.0
WORK_S = {"reset_gpu": 600.0, "reboot_node": 900.0, "repair": 7200.0}
ALERT_S = 120.0  # no automation: the page reaches a person this long after the fault


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
        running = store.plans_in_state(self.conn, "running", dry_run=False)
        self.conn.commit()
        return bool(running)

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
        remedies.forget_the_remediators(self.conn)
        self.conn.commit()

    def _ask(self) -> None:
        """A person is needed for each plan held, and for each node left out for a person."""
        now, conn = self.now_s(), self.conn
        for plan_id, node in store.plans_in_state(conn, "held", dry_run=False):
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
            # keyed by what the fault is, not its id: ids count on across the process (the arms before)
            due = max(person.due(needed, f"{node}:{f.gpu}:{f.start_s!r}"), busy_until.get(node, 0.0))
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

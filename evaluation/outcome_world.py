"""The world the remediator's outcomes are scored in: a mix of faults, a person, and schedulers standing in.

`outcome_scenario(seed)` is a simulated week of a fleet of small nodes with a
mix of fault classes, each fault of the mock's own remedy model
(services/mock_dcgm/remedies.py):

- `reset`: an XID a GPU reset ends (119, 120, 62, 95, 109), lasting until then;
- `reboot`: a GPU falling off the bus once, back after a reboot;
- `persistent`: a failed row remap, or a GPU that falls off the bus again ten
  minutes after every reboot: both stay until a repair;
- `flaky`: a reset-class XID that comes back 6 h after each reset with
  probability 1/2;
- `job`: a job's crash (the same application XID on its GPUs, over in 5 min);
- `place`: a node's fault: three of its GPUs fall off the bus at once.

Faults fall in working hours and out of them, on all days of the week. A
`Person` acts within `within_h` working hours (Monday to Friday, 09:00 to
17:00 UTC) of being needed; when exactly is drawn per need, seeded. The
schedulers the remediator acts through are one in-process `SimScheduler`
(cordon, drain by eviction of the pods of the node's busy GPUs, uncordon) and
`SimNodeExec`, the exec driver calling the mock fleet's reset, reboot and
compute check directly, on the simulation's clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.fleet import Fleet
from services.remediator.drivers.base import DriverResult, SchedulerName
from services.remediator.drivers.node_exec import NodeExec, Operation

from .scenario import Scenario

FaultClass = Literal["reset", "reboot", "persistent", "flaky", "job", "place"]
CLASSES: tuple[FaultClass, ...] = ("reset", "reboot", "persistent", "flaky", "job", "place")
HOUR = 3600.0
RESET_XIDS = (119, 120, 62, 95, 109)
# faults per class in a week (the rest of the mix is what real fleets see most: resets)
MIX: dict[FaultClass, int] = {"reset": 12, "reboot": 3, "persistent": 2, "flaky": 2, "job": 3, "place": 1}


@dataclass(slots=True)
class OutcomeScenario:
    """A scenario whose faults each carry their class and their incident (faults that are one event)."""

    scenario: Scenario
    classes: list[FaultClass]
    incidents: list[int]  # per fault: its incident (a place's GPUs together are one)


def outcome_scenario(
    seed: int, *, days: float = 7.0, nodes: int = 8, gpus_per_node: int = 2
) -> OutcomeScenario:
    """A week of the mix (`MIX`, scaled to `days`), at random times in its days, each on a node with no other
    fault of the mix within 12 h of it; the run goes on for 2 more days, so that a fault of the weekend sees
    its person on the Monday after (the week starts on a Monday)."""
    rng = random.Random(f"outcomes:{seed}")  # noqa: S311 - reproducible, not secret
    hours = days * 24 + 48
    faults: list[dict[str, Any]] = []
    classes: list[FaultClass] = []
    incidents: list[int] = []
    busy: dict[int, list[float]] = {n: [] for n in range(nodes)}
    remap_nodes = [n for n in range(nodes) if n % 4 != 3]  # the V100 node (every fourth) remaps no rows
    plan = [cls for cls, n in MIX.items() for _ in range(max(1, round(n * days / 7)))]
    rng.shuffle(plan)
    for incident, cls in enumerate(plan):
        for _ in range(200):
            node = rng.choice(remap_nodes if cls == "persistent" else range(nodes))
            at = round(rng.uniform(1, days * 24 - 1) * HOUR + rng.uniform(1, 59), 3)
            if all(abs(at - t) > 12 * HOUR for t in busy[node]):
                break
        busy[node].append(at)
        gpu = rng.randrange(gpus_per_node)
        base = {"node": node, "gpu": gpu, "after_s": at}
        match cls:
            case "reset":
                made = [{"kind": "xid", **base, "params": {"code": rng.choice(RESET_XIDS)}}]
            case "reboot":
                made = [{"kind": "fall_off_bus", **base}]
            case "persistent":
                made = [
                    {"kind": "row_remap_failure", **base}
                    if rng.random() < 0.5
                    else {"kind": "fall_off_bus", **base, "recur_after_s": 600.0, "recur_probability": 1.0}
                ]
            case "flaky":
                made = [{"kind": "xid", **base, "params": {"code": 119}, "recur_after_s": 6 * HOUR,
                         "recur_probability": 0.5}]  # fmt: skip
            case "job":
                crash = {"gpus": gpus_per_node, "code": rng.choice((13, 31)), "spread_s": 3.0}
                made = [{"kind": "job_crash", **base, "duration_s": 300.0, "params": crash}]
            case _:  # place: every GPU of the node off the bus together
                made = [{"kind": "fall_off_bus", **base, "gpu": g, "after_s": round(at + g * 2.5, 3)}
                        for g in range(gpus_per_node)]  # fmt: skip
        faults += made
        classes += [cls] * len(made)
        incidents += [incident] * len(made)
    scenario = Scenario(
        name=f"outcomes-seed-{seed}", hours=hours, nodes=nodes, gpus_per_node=gpus_per_node, seeds=[seed],
        poll_s=60.0, score_every_s=60.0, predict_every_s=3600.0, faults=faults,
        description="a week of reset-fixable, reboot-fixable, persistent, flaky, job and place faults",
    )  # fmt: skip
    return OutcomeScenario(scenario, classes, incidents)


def monday_before(t: float) -> float:
    """00:00 UTC of the Monday on or before epoch seconds `t`."""
    day = datetime.fromtimestamp(t, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day - timedelta(days=day.weekday())).timestamp()


def add_working_hours(t: float, hours: float, *, start_h: int = 9, end_h: int = 17) -> float:
    """The time `hours` working hours (Monday to Friday, start_h to end_h UTC) after `t`."""
    left = hours * HOUR
    at = datetime.fromtimestamp(t, UTC)
    while True:
        day = at.replace(hour=0, minute=0, second=0, microsecond=0)
        opens, closes = day + timedelta(hours=start_h), day + timedelta(hours=end_h)
        if at.weekday() < 5 and at < closes:
            begin = max(at, opens)
            span = (closes - begin).total_seconds()
            if left <= span:
                return (begin + timedelta(seconds=left)).timestamp()
            left -= span
        at = day + timedelta(days=1)


@dataclass(slots=True)
class Person:
    """An operator who acts within `within_h` working hours of being needed (drawn per need, seeded)."""

    seed: int
    within_h: float = 4.0
    visits: list[tuple[float, str, str]] = field(default_factory=list)  # (at, node, what they did)

    def due(self, needed_at: float, key: str) -> float:
        share = random.Random(f"person:{self.seed}:{key}").random()  # noqa: S311 - reproducible
        return add_working_hours(needed_at, share * self.within_h)


@dataclass(slots=True)
class NodeState:
    cordoned_at: float | None = None
    by_remediator: bool = False
    drain_started: float | None = None


class SimScheduler:
    """A scheduler standing in for Kubernetes or Slurm, on the simulation's clock: cordon marks the node the
    remediator's, a drain evicts the pods of the node's busy GPUs and takes `drain_s`, a return uncordons a
    node the remediator took out. Each cordon, eviction and return is kept for the outcome accounting."""

    name: SchedulerName = "kubernetes"

    def __init__(self, fleet: Fleet, clock: Callable[[], float], *, drain_s: float = 30.0) -> None:
        self.fleet, self.clock, self.drain_s = fleet, clock, drain_s
        self.nodes: dict[str, NodeState] = {}
        self.spans: dict[str, list[list[Any]]] = {}  # node -> [[cordoned_at, returned_at | None, by]]
        self.evictions: list[tuple[float, str, int, int]] = []  # (at, node, pods, jobs)

    def _node(self, node: str) -> NodeState:
        return self.nodes.setdefault(node, NodeState())

    def cordon(self, node: str, *, by_remediator: bool) -> None:
        state = self._node(node)
        if state.cordoned_at is None:
            state.cordoned_at = self.clock()
            self.spans.setdefault(node, []).append([state.cordoned_at, None, None])
        state.by_remediator = state.by_remediator or by_remediator

    def uncordon(self, node: str, *, by: str) -> bool:
        state = self._node(node)
        if state.cordoned_at is None:
            return False
        self.spans[node][-1][1:] = [self.clock(), by]
        self.nodes[node] = NodeState()
        return True

    def evict(self, node: str) -> None:
        """Evict the pods of the node's GPUs that run a job now (one pod a GPU; a job may span several)."""
        sims = [n for n in self.fleet.nodes if n.hostname == node]
        jobs = [g.job_at(self.clock()) for n in sims for g in n.gpus]
        pods = [j.pod for j in jobs if j is not None]
        if pods:
            self.evictions.append((self.clock(), node, len(pods), len(set(pods))))

    def cordoned(self, node: str) -> bool:
        return self._node(node).cordoned_at is not None

    def take_out(self, node: str, *, finding: str, plan_id: int) -> DriverResult:
        self.cordon(node, by_remediator=True)
        return DriverResult("ok", {"node": node, "finding": finding})

    def drain(self, node: str, *, past_deadline: bool) -> DriverResult:
        state = self._node(node)
        if state.drain_started is None:
            state.drain_started = self.clock()
            self.evict(node)
        if self.clock() - state.drain_started < self.drain_s:
            return DriverResult("in_progress", {"pods": "terminating"})
        return DriverResult("ok", {"pods": 0})

    def put_back(self, node: str) -> DriverResult:
        state = self._node(node)
        if state.cordoned_at is not None and not state.by_remediator:
            return DriverResult("not_owned", {}, "cordoned by someone else")
        self.uncordon(node, by="remediator")
        return DriverResult("ok", {})

    def close(self) -> None:
        return None


class SimNodeExec(NodeExec):
    """The exec driver, calling the mock fleet's reset, reboot and compute check in process."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__({})
        self.fleet = fleet

    def driver_of(self, operation: Operation) -> Literal["exec", "webhook"]:
        return "webhook"

    def run(self, operation: Operation, *, node: str, gpus: dict[str, int], plan_id: int) -> DriverResult:
        body = {"node": node, "gpu_uuid": ",".join(sorted(gpus)), "plan_id": str(plan_id)}
        try:
            if operation == "compute_check":
                answer = self.fleet.compute_check(sorted(gpus), "hard_failure")
                if not answer["passed"]:
                    return DriverResult("failed", answer, "the compute check failed")
                return DriverResult("ok", answer)
            done = self.fleet.remedy("reset_gpu" if operation == "reset_gpu" else "reboot_node", body)
        except FaultError as e:
            return DriverResult("failed", {}, f"{operation} failed: {e}")
        return DriverResult("ok", {k: done[k] for k in ("faults_ended", "faults_left")})

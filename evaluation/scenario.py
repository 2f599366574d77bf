"""Evaluation scenarios: a fleet, a run length, and the faults to inject (JSON files or generated).

A scenario file is one JSON object:

    {"name": "...", "hours": 72, "nodes": 4, "gpus_per_node": 8,
     "models": ["h100-sxm", "h100-sxm", "a100-sxm4-80gb", "v100-sxm2-32gb"],
     "seeds": [101, 102, 103], "poll_s": 120, "score_every_s": 300, "predict_every_s": 3600,
     "faults": [{"kind": "sbe_storm", "node": 0, "gpu": 1, "after_s": 21617.3,
                 "params": {"rate_per_hour": 2, "growth_per_hour": 0.5}},
                {"kind": "dbe", "node": 0, "gpu": 1, "after_s": 205321.9}, ...]}

Faults use the mock's request format (services/mock_dcgm/fleet.py: kind, node,
gpu, after_s, duration_s, params). The ground truth, failure times included,
comes from the mock (Fleet.ground_truth): a GPU's failure is its first hard
failure (DBE, failed remap, fall off the bus, critical XID), whatever
precursors came before it.

`generated_scenario(seed)` is the default suite's scenario for one seed: every
model, precursors that start 50-60 h or 12-30 h before a scheduled failure,
sudden failures, transients that end, repeats, several faults on one GPU,
hot-but-healthy GPUs, and untouched ones, all at random off-grid seconds.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.mock_dcgm.fleet import DEFAULT_MODELS
from services.mock_dcgm.profiles import MODELS
from shared.plumbing.errors import GpuHealthError

HOUR = 3600.0


class ScenarioError(GpuHealthError):
    """A scenario file is malformed."""


@dataclass(slots=True)
class Scenario:
    name: str
    hours: float = 72.0
    nodes: int = 4
    gpus_per_node: int = 8
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    seeds: list[int] = field(default_factory=lambda: [101])
    poll_s: float = 120.0
    score_every_s: float = 300.0
    predict_every_s: float = 3600.0
    faults: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""
    hosts_per_rack: int = 0  # >0: the hosts in racks of this many, in order (rack-0, rack-1, ...)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def load_scenario(path: Path) -> Scenario:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ScenarioError(f"scenario {path}: {e}") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("faults", []), list):
        raise ScenarioError(f"scenario {path}: expected an object with a 'faults' list")
    known = set(Scenario.__dataclass_fields__)
    extra = set(raw) - known
    if extra:
        raise ScenarioError(f"scenario {path}: unknown fields {sorted(extra)}; allowed: {sorted(known)}")
    try:
        scenario = Scenario(**{"name": path.stem, **raw})
    except TypeError as e:
        raise ScenarioError(f"scenario {path}: {e}") from e
    _check(scenario, path)
    return scenario


def _check(s: Scenario, path: Path) -> None:
    def bad(why: str) -> ScenarioError:
        return ScenarioError(f"scenario {path}: {why}")

    numbers = (s.hours, s.poll_s, s.score_every_s, s.predict_every_s)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
        raise bad("hours, poll_s, score_every_s and predict_every_s are numbers")
    if not 0 < s.hours <= 24 * 30:
        raise bad("hours must be above 0 and at most 720")
    if not 10 <= s.poll_s <= 3600 or not s.poll_s <= s.score_every_s <= s.predict_every_s:
        raise bad("need 10 <= poll_s <= score_every_s <= predict_every_s, poll_s at most 3600")
    if not (isinstance(s.nodes, int) and 1 <= s.nodes <= 64 and isinstance(s.gpus_per_node, int)
            and 1 <= s.gpus_per_node <= 16):  # fmt: skip
        raise bad("nodes must be 1..64 and gpus_per_node 1..16")
    if not s.models or any(m not in MODELS for m in s.models):
        raise bad(f"models must name known models: {', '.join(MODELS)}")
    if not s.seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in s.seeds):
        raise bad("seeds is a non-empty list of integers")
    if not all(isinstance(f, dict) for f in s.faults):
        raise bad("every fault is an object")
    if (
        isinstance(s.hosts_per_rack, bool)
        or not isinstance(s.hosts_per_rack, int)
        or not 0 <= s.hosts_per_rack <= 64
    ):
        raise bad("hosts_per_rack must be a whole number 0..64 (0: no racks)")


# (precursor kind, params, hard failure that follows) per model family
_PRECURSORS: list[tuple[str, dict[str, float], dict[str, Any]]] = [
    ("sbe_storm", {"rate_per_hour": 2.0, "growth_per_hour": 0.3}, {"kind": "dbe"}),
    ("pcie_replay_storm", {"replays_per_minute": 0.5, "growth_per_hour": 0.3}, {"kind": "fall_off_bus"}),
    ("thermal_creep", {"c_per_hour": 0.35, "max_c": 25.0}, {"kind": "xid", "params": {"code": 79}}),
]
_AMPERE_ROWS = (
    "remapped_rows",
    {"rows_per_hour": 0.3, "growth_per_hour": 0.1},
    {"kind": "row_remap_failure"},
)
_VOLTA_PAGES = ("retired_pages", {"pages_per_hour": 0.2, "growth_per_hour": 0.05}, {"kind": "dbe"})


def generated_scenario(seed: int, *, hours: float = 72.0, nodes: int = 4, gpus_per_node: int = 8) -> Scenario:
    """The default suite's fleet history for one seed (see the module docstring)."""
    rng = random.Random(f"scenario:{seed}")  # noqa: S311 - reproducible, not secret
    models = list(DEFAULT_MODELS)
    slots = [(n, g) for n in range(nodes) for g in range(gpus_per_node)]
    rng.shuffle(slots)
    faults: list[dict[str, Any]] = []

    def at(lo_h: float, hi_h: float) -> float:
        return round(rng.uniform(lo_h, hi_h) * HOUR + rng.uniform(1, 59), 3)  # off the poll grid

    def model_of(slot: tuple[int, int]) -> str:
        return models[slot[0] % len(models)]

    def add(slot: tuple[int, int], kind: str, after_s: float, **extra: Any) -> None:
        faults.append({"kind": kind, "node": slot[0], "gpu": slot[1], "after_s": after_s, **extra})

    n_precursor = max(4, len(slots) // 4)
    for i in range(min(n_precursor, len(slots))):
        slot = slots.pop()
        key = model_of(slot)
        options = list(_PRECURSORS)
        options.append(_VOLTA_PAGES if MODELS[key].page_retirement else _AMPERE_ROWS)
        kind, params, failure = options[i % len(options)]
        long_lead = i % 4 != 3  # three in four start 50-60 h ahead; the rest 12-30 h
        lead_h = rng.uniform(50, 60) if long_lead and hours >= 64 else rng.uniform(12, min(30, hours - 6))
        fail_s = at(min(hours - 4, lead_h + 2), hours - 2)
        add(slot, kind, max(fail_s - lead_h * HOUR, 60.0), params=params)
        extra = {"duration_s": 1800.0} if failure["kind"] == "fall_off_bus" else {}
        add(slot, failure["kind"], fail_s, params=failure.get("params", {}), **extra)
    # sudden hard failures: nothing to predict, everything to detect at once
    sudden: list[tuple[str, dict[str, float]]] = [("dbe", {}), ("xid", {"code": 48}), ("xid", {"code": 74})]
    for kind, params in sudden[: len(slots)]:
        add(slots.pop(), kind, at(4, hours - 2), params=params)
    if slots:
        slot = slots.pop()
        add(slot, "row_remap_failure" if MODELS[model_of(slot)].row_remapping else "dbe", at(4, hours - 2))
    if slots:  # falls off the bus three times, back each time: the repeats must escalate to inspect
        slot, first = slots.pop(), rng.uniform(2, max(2.0, hours - 16))
        for k in range(3):
            add(
                slot, "fall_off_bus", round((first + 6 * k) * HOUR + rng.uniform(1, 59), 3), duration_s=1200.0
            )
    if slots:  # one application XID alone: stays restart_workload and clears
        add(
            slots.pop(),
            "xid",
            at(2, hours - 4),
            duration_s=300.0,
            params={"code": rng.choice((13, 31, 43, 45))},
        )
    if slots:  # a burst of five on one GPU within two hours: escalates
        slot, burst = slots.pop(), rng.uniform(2, hours - 4)
        for k in range(5):
            add(slot, "xid", round((burst + 0.4 * k) * HOUR + rng.uniform(1, 59), 3), duration_s=300.0,
                params={"code": 13})  # fmt: skip
    if slots:  # transients that end, two on one GPU
        slot = slots.pop()
        add(slot, "thermal_runaway", at(2, hours / 2), duration_s=1800.0, params={"c_per_minute": 3.0})
        add(slot, "power_brake", at(hours / 2 + 1, hours - 4), duration_s=900.0)
    if slots:
        add(slots.pop(), "nvlink_errors", at(2, hours - 4), duration_s=3600.0)
    # hot but healthy: full load around the clock, a few degrees under slowdown, all run
    for _ in range(min(4, len(slots) // 2)):
        add(slots.pop(), "heavy_workload", 0.0)
    return Scenario(
        name=f"suite-seed-{seed}", hours=hours, nodes=nodes, gpus_per_node=gpus_per_node, models=models,
        seeds=[seed], faults=faults,
        description="default suite: precursors then failures, sudden failures, repeats, transients, hot GPUs",
    )  # fmt: skip


def job_scenario(seed: int, *, hours: float = 24.0) -> Scenario:
    """The default suite's scenario of what several GPUs show together, on 4 hosts of 8 GPUs in 2 racks.

    Job crashes (the same application XID on every GPU of one job within seconds): a one-host
    job of 8 GPUs that crashes four times in the day, a 16-GPU job across two hosts, a 2-GPU
    job in a crash loop (four crashes 15 minutes apart); a lone application XID beside them
    (the GPU's own finding); three GPUs of one host falling off the bus together (a node
    fault), and two GPUs on each of two hosts of one rack (a rack fault). Times are drawn per
    seed, off the poll grid.
    """
    if hours < 24:
        raise ScenarioError("the job scenario needs at least 24 simulated hours")
    rng = random.Random(f"jobs:{seed}")  # noqa: S311 - reproducible, not secret
    faults: list[dict[str, Any]] = []

    def at(hour: float) -> float:  # within the hour, off the poll grid
        return round((hour + rng.uniform(0.0, 0.8)) * HOUR + rng.uniform(1, 59), 3)

    def crash(node: int, gpu: int, gpus: int, code: int, after_s: float, job: int = 0) -> None:
        spread = round(rng.uniform(1, 8), 2)  # the workers die within seconds of each other
        params = {"gpus": gpus, "code": code, "spread_s": spread, "job": job}
        faults.append({"kind": "job_crash", "node": node, "gpu": gpu, "after_s": after_s,
                       "duration_s": 300.0, "params": params})  # fmt: skip

    for k, code in enumerate((13, 31, 43, 13)):  # one host's job, restarted and crashing again
        crash(0, 0, 8, code, at(2 + 4 * k), job=1)
    crash(1, 0, 16, 31, at(4))  # one job across two hosts
    loop = at(8)
    for k in range(4):  # a crash loop: a 2-GPU job restarted and dying every 15 minutes
        crash(3, 0, 2, 13, loop + k * 900 + rng.uniform(0, 60), job=2)
    faults.append({"kind": "xid", "node": 3, "gpu": 2, "after_s": at(12), "duration_s": 300.0,
                   "params": {"code": 13}})  # fmt: skip
    for place, hour in (([(3, 3), (3, 4), (3, 5)], 16), ([(2, 6), (2, 7), (3, 6), (3, 7)], 20)):
        start = at(hour)
        for node, gpu in place:
            faults.append({"kind": "fall_off_bus", "node": node, "gpu": gpu, "duration_s": 1200.0,
                           "after_s": round(start + rng.uniform(0, 20), 3)})  # fmt: skip
    return Scenario(
        name=f"jobs-seed-{seed}", hours=hours, nodes=4, gpus_per_node=8, models=list(DEFAULT_MODELS),
        seeds=[seed], faults=faults, hosts_per_rack=2,
        description="job crashes across GPUs and hosts, a lone application XID, a node fault, a rack fault",
    )  # fmt: skip

"""The evaluation's job-level attribution and false escalations, on hand-built runs: they catch a
job's crash blamed on its GPUs, one crash seen as two findings, and a node fault counted N times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from evaluation.metrics import summarise, totals
from evaluation.run import Record
from evaluation.scenario import job_scenario
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.scorer.rules_config import load_rules

RULES = load_rules()
M = 60_000
JOB = ["GPU-j0", "GPU-j1", "GPU-j2", "GPU-j3"]
NODE = ["GPU-n0", "GPU-n1", "GPU-n2"]
T_CRASH, T_NODE = 100 * M, 300 * M


def fault(i: int, gpu: str, kind: str, start_ms: int, **kw: Any) -> dict[str, Any]:
    sub = {"xid": "xid", "fall_off_bus": "availability"}[kind]
    return {"id": i, "gpu_uuid": gpu, "kind": kind, "subsystem": sub, "start_ms": start_ms, "end_ms": None,
            "hard_failure": kind == "fall_off_bus", "precursor": False, "params": {}, "hostname": "h1",
            "job_crash": None, **kw}  # fmt: skip


def run(
    *, findings: list[tuple[str, str, str, int, tuple[str, ...]]], job_action: str, node_action: str
) -> Record:
    faults = [fault(i, g, "xid", T_CRASH + 1000 * i, params={"code": 13}, end_ms=T_CRASH + 5 * M, job_crash=7)
              for i, g in enumerate(JOB)]  # fmt: skip
    faults += [fault(10 + i, g, "fall_off_bus", T_NODE + 2000 * i, end_ms=T_NODE + 20 * M, hostname="h2")
               for i, g in enumerate(NODE)]  # fmt: skip
    crash = {"id": 7, "job": "ml/train", "code": 13, "start_ms": T_CRASH, "last_ms": T_CRASH + 3000,
             "gpus": JOB,
             "hosts": ["h1"]}  # fmt: skip
    rec = Record(scenario="t", seed=1, poll_s=120, score_every_s=300, end_ms=600 * M,
                 truth={"faults": faults, "failures": {}, "job_crashes": [crash]},
                 gpus=JOB + NODE)  # fmt: skip
    for t in range(0, 600 * M + 1, 5 * M):
        actions = {g: "none" for g in rec.gpus}
        states: dict[str, dict[str, str]] = {}
        if T_CRASH <= t <= T_CRASH + 60 * M:
            actions.update(dict.fromkeys(JOB, job_action))
            if job_action != "none":
                states.update({g: {"xid": "degraded"} for g in JOB})
        if T_NODE <= t <= T_NODE + 25 * M:
            actions.update(dict.fromkeys(NODE, node_action))
            states.update({g: {"availability": "unhealthy"} for g in NODE})
        rec.cycles.append((t, states, actions))
        seen = [f for f in findings if (f[0] == "job_crash" and T_CRASH <= t <= T_CRASH + 60 * M)
                or (f[0] == "node_fault" and T_NODE <= t <= T_NODE + 25 * M)]  # fmt: skip
        rec.findings.append((t, seen))
    return rec


def stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


ONE_JOB = ("job_crash", "ml/train", stamp(T_CRASH + 120_000), 4, tuple(JOB))
ONE_NODE = ("node_fault", "h2", stamp(T_NODE), 3, tuple(NODE))
EARLIER = ("job_crash", "ml/train", stamp(T_CRASH - 40 * M), 4, tuple(JOB))  # the job's crash before


def test_a_job_crash_seen_once_and_a_node_fault_seen_once_score_clean() -> None:
    s = summarise(run(findings=[ONE_JOB, ONE_NODE], job_action="none", node_action="reboot_node"), RULES)
    job, node = s.shared["job"], s.shared["node"]
    assert (job.faults, job.one_finding, job.gpus, job.judged, job.blamed, job.escalated) == (
        1,
        1,
        4,
        4,
        0,
        0,
    )
    assert (node.faults, node.one_finding, node.gpus, node.escalated) == (1, 1, 3, 0)
    assert s.healthy_gpus == 4  # a job's crash leaves its GPUs healthy in the truth
    assert s.hard_faults == 3
    figures = totals([s])
    assert figures["targets"]["0 GPUs escalated for a job's crash"] is True
    assert figures["targets"]["every job crash is one job finding"] is True


def test_a_crash_blamed_on_its_gpus_and_a_node_fault_counted_n_times_are_caught() -> None:
    halves = [
        ("job_crash", "ml/train", stamp(T_CRASH), 2, tuple(JOB[:2])),
        ("job_crash", "ml/train", stamp(T_CRASH + 150_000), 2, tuple(JOB[2:])),
    ]
    s = summarise(run(findings=[*halves], job_action="inspect", node_action="inspect"), RULES)
    job, node = s.shared["job"], s.shared["node"]
    assert (job.one_finding, job.blamed, job.escalated) == (0, 4, 4)
    assert (node.one_finding, node.escalated) == (0, 3)
    assert s.false_degraded == 4  # and the GPUs count as falsely degraded
    figures = totals([s])
    assert figures["targets"]["0 GPUs escalated for a job's crash"] is False
    assert figures["targets"]["every job crash is one job finding"] is False
    assert any("escalated to inspect" in m for m in s.misses)


def test_the_job_scenario_holds_job_crashes_a_node_fault_and_a_rack_fault_the_mock_accepts() -> None:
    scenario = job_scenario(101)
    assert scenario == job_scenario(101)  # reproducible per seed
    fleet = Fleet(FleetSpec(nodes=scenario.nodes, gpus_per_node=scenario.gpus_per_node, seed=101),
                  SimClock(start_s=1_800_000_000.0))  # fmt: skip
    for request in scenario.faults:
        fleet.inject(dict(request))
    truth = fleet.ground_truth()
    assert len(truth["job_crashes"]) == 9
    assert sorted(len(c["hosts"]) for c in truth["job_crashes"]) == [1] * 8 + [2]
    assert {c["job"] for c in truth["job_crashes"]} >= {"ml-training/ddp-job-1", "ml-training/ddp-job-2"}
    assert sum(f["kind"] == "fall_off_bus" for f in truth["faults"]) == 7


def test_the_same_jobs_earlier_crash_still_in_reach_is_not_this_crashs_second_finding() -> None:
    s = summarise(
        run(findings=[EARLIER, ONE_JOB, ONE_NODE], job_action="none", node_action="reboot_node"), RULES
    )
    assert (s.shared["job"].faults, s.shared["job"].one_finding) == (1, 1)

"""The whole loop, live, on the real kube-apiserver and Slurm (#40): the scorer's own judgement of the GPU's
XIDs (the committed rules and XID catalogue), the remediator's decisions on its verdicts, its steps through
both schedulers, the remedy it records, and the scorer again after it.

- a reset-fixable XID (119, GSP timeout) goes out, is reset, is validated and comes back;
- a fault the reset does not end (the XID again after the reset) fails the validation at once: the node
  stays out and the plan escalates to a reboot, held for approval;
- the XID again after the node came back escalates: the reboot, not another reset;
- a reset-class XID beside a reboot held for approval starts it, and the node comes back;
- a repair mark on the GPU withdraws the held reboot, validates the node and returns it;
- a dry-run remediator beside the live one decides the same verdicts and changes nothing of the live one's.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from services.remediator.decide import decide
from services.remediator.drivers.kubernetes import TAINT_KEY, KubernetesDriver
from services.remediator.drivers.slurm import SlurmDriver
from services.remediator.findings import Finding, NodeMap, from_verdict
from services.scorer.cycle import judge
from services.scorer.rules_config import load_rules
from shared.contract.models_health import HealthVerdict
from shared.plumbing.db import connect
from tests.helpers.kube import KubeAdmin
from tests.helpers.remediation import TRUE, Remediator, add_fleet, add_nodes, gpu_uuid, rows, sample_again

RULES = load_rules()
GSP_TIMEOUT = 119  # NVIDIA: reset the GPU
FALLEN_OFF_THE_BUS = 79  # NVIDIA: reboot the node


def slurm_state(conf: Path, node: str) -> tuple[str, str]:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    word, _, reason = done.stdout.strip().partition("|")
    return word.rstrip("*~#!%$@^-+"), reason


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@dataclass
class Loop:
    """One GPU node in both schedulers, the scorer judging it, and the remediators deciding its verdicts."""

    live: Remediator
    host: str  # the hostname, and its Slurm NodeName
    kube_name: str
    kube: KubeAdmin
    slurm_conf: Path
    gpus: list[str]
    beside: list[Remediator] = field(default_factory=list)  # dry runs deciding the same verdicts
    verdicts: list[HealthVerdict] = field(default_factory=list)

    def xid(self, code: int = GSP_TIMEOUT, gpu: int = 0) -> None:
        """The GPU logs an XID now (as the sink stores the collector's event)."""
        with connect(self.live.db) as conn:
            conn.execute(
                "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
                " VALUES (%s, %s, 'xid', %s, 'mock', 'test', jsonb_build_object('xid', %s::int))",
                (datetime.now(UTC), self.gpus[gpu], self.host, code),
            )
            conn.commit()

    def cycle(self) -> list[HealthVerdict]:
        """The GPUs report, a scoring cycle judges them, every remediator decides the verdicts it changed
        (dry runs first: the verdict reaches them as soon as the live one), and the plans step on."""
        now = datetime.now(UTC)
        sample_again(self.live.db, self.host, now)
        with connect(self.live.db) as conn:
            result = judge(conn, now, RULES, gpus=self.gpus)
        changed = [v for kind, _, v in result.messages if kind == "health" and isinstance(v, HealthVerdict)]
        self.verdicts += changed
        findings = [from_verdict(v, "gpu-health") for v in changed]
        for r in [*self.beside, self.live]:
            decide_findings(r, findings)
            r.run_until_settled(pause_s=0.06)
        return changed

    def until(self, check: Callable[[], bool], what: str, cycles: int = 12) -> None:
        """Scoring cycles (one a second at most) until `check` holds."""
        for _ in range(cycles):
            if check():
                return
            time.sleep(1.0)
            self.cycle()
        assert check(), what

    def plans(self, dry_run: bool = False) -> list[tuple[Any, ...]]:
        return rows(
            self.live.db,
            "SELECT action, state, held_for FROM remediations WHERE dry_run = %s ORDER BY id",
            (dry_run,),
        )

    def out(self) -> bool:
        """Cordoned with the remediator's taint in Kubernetes, and drained in Slurm."""
        node = self.kube.node(self.kube_name)
        cordoned = bool(node["spec"].get("unschedulable")) and any(
            t["key"] == TAINT_KEY for t in node["spec"].get("taints") or []
        )
        return cordoned and slurm_state(self.slurm_conf, self.host)[0] in ("drained", "draining")

    def back(self) -> bool:
        """Uncordoned without the remediator's taint, and idle in Slurm."""
        spec = self.kube.node(self.kube_name)["spec"]
        ours = [t for t in spec.get("taints") or [] if t["key"] == TAINT_KEY]
        return (
            not spec.get("unschedulable")
            and not ours
            and slurm_state(self.slurm_conf, self.host)
            == (
                "idle",
                "none",
            )
        )


def decide_findings(r: Remediator, findings: list[Finding]) -> None:
    with connect(r.db) as conn:
        for finding in findings:
            decide(conn, finding, policy=r.policy, nodes=r.nodes, dry_run=r.executor.dry_run, now=r.clock())
            conn.commit()


@pytest.fixture
def loop(
    remediator_factory: Callable[..., Remediator],
    kube_driver: Callable[..., KubernetesDriver],
    kube: KubeAdmin,
    kube_nodes: Callable[[int], list[str]],
    slurm_conf: Path,
    policy: Any,
) -> Iterator[Callable[..., Loop]]:
    """A live remediator acting through the API server and Slurm on Slurm's gpu-node-02 (a Kubernetes node of
    its own, by the node map), in a fleet of 40; `dry_runs` dry-run remediators beside it."""
    host = "gpu-node-02"
    wait_for(lambda: slurm_state(slurm_conf, host)[0] == "idle", f"{host} idle")

    def build(*, dry_runs: int = 0) -> Loop:
        (kube_name,) = kube_nodes(1)
        nodes = NodeMap(hosts={host: {"kubernetes": kube_name}})
        live = remediator_factory(
            dry_run=False,
            schedulers=[kube_driver(grace_period_s=0), SlurmDriver(slurm_conf=slurm_conf)],
            commands={"reset_gpu": TRUE, "reboot": TRUE, "compute_check": TRUE},
            policy_changes={"drain": policy.drain.model_copy(update={"grace_period_s": 0})},
            nodes=nodes,
        )
        gpus = [gpu_uuid(90, i) for i in range(2)]  # none of the spares'
        add_nodes(live.db, {host: gpus})
        add_fleet(live.db, 39, names=lambda i: f"spare-{i:02d}")  # the breaker's 10 %: 4 nodes may go out
        beside = [remediator_factory(dry_run=True, nodes=nodes) for _ in range(dry_runs)]
        return Loop(live, host, kube_name, kube, slurm_conf, gpus, beside)

    yield build
    subprocess.run(
        ["scontrol", "update", f"nodename={host}", "state=resume"],
        env={**os.environ, "SLURM_CONF": str(slurm_conf)},
        capture_output=True,
        check=False,
    )
    wait_for(lambda: slurm_state(slurm_conf, host)[0] == "idle", f"{host} idle again")


def gone_out_and_reset(loop: Loop) -> None:
    """An XID 119 is judged, decided, and the node taken out and its GPU reset: the plan validates."""
    loop.xid()
    changed = loop.cycle()
    assert [(v.subsystem, v.state, v.rule, v.action) for v in changed if v.state != "healthy"] == [
        ("xid", "unhealthy", "xid_119", "reset_gpu")
    ]
    assert loop.out()
    assert rows(loop.live.db, "SELECT steps[step + 1], state FROM remediations WHERE NOT dry_run") == [
        ("validate", "running")
    ]
    assert rows(
        loop.live.db,
        "SELECT g.gpu_uuid, g.remedy, g.source, r.dry_run FROM gpu_remedies g"
        " JOIN remediations r ON r.id = g.plan_id",
    ) == [(loop.gpus[0], "reset_gpu", "remediator", False)]  # a dry run's remedy stays with its plan


def test_a_reset_fixable_fault_goes_out_is_reset_validated_and_comes_back(loop: Callable[..., Loop]) -> None:
    started = time.monotonic()
    run = loop()
    gone_out_and_reset(run)
    run.until(lambda: run.plans() == [("reset_gpu", "done", None)], "validated and returned")
    assert run.back()
    assert time.monotonic() - started < 180  # within minutes
    # the scorer counts the XID no more (resolved by the plan's reset); its history keeps it
    xid = [v for v in run.verdicts if v.subsystem == "xid" and v.gpu_uuid == run.gpus[0]]
    assert [v.state for v in xid][-2:] == ["unhealthy", "healthy"]
    resolved: Any = xid[-1].evidence["resolved_by"]
    assert resolved["by"] == "plan 1"
    assert rows(
        run.live.db,
        "SELECT state, rule FROM gpu_health WHERE subsystem = 'xid' AND gpu_uuid = %s ORDER BY time",
        (run.gpus[0],),
    )[-2:] == [("unhealthy", "xid_119"), ("healthy", None)]  # fmt: skip
    passed = rows(
        run.live.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'passed'"
    )
    assert passed
    assert "3 healthy cycles" in passed[0][0]


def test_a_fault_the_reset_does_not_end_stays_out_and_escalates(loop: Callable[..., Loop]) -> None:
    run = loop()
    gone_out_and_reset(run)
    time.sleep(0.05)
    run.xid()  # the reset did not end it: the GPU times out again
    run.until(lambda: len(run.plans()) == 2, "escalated")
    assert run.plans() == [("reset_gpu", "escalated", None), ("reboot_node", "held", "approval")]
    (failed,) = rows(
        run.live.db, "SELECT reason FROM remediation_events WHERE kind = 'validation' AND status = 'failed'"
    )
    assert failed[0].startswith("recurred after the remedy")
    for _ in range(3):  # it stays out, however many cycles pass
        run.cycle()
    assert run.out()
    assert run.plans()[-1] == ("reboot_node", "held", "approval")


def test_a_recurrence_after_the_return_escalates(loop: Callable[..., Loop]) -> None:
    run = loop()
    gone_out_and_reset(run)
    run.until(lambda: run.plans() == [("reset_gpu", "done", None)], "validated and returned")
    assert run.back()
    time.sleep(0.05)
    run.xid()  # back within a day of the reset
    changed = run.cycle()
    assert ("history", "unhealthy", "pattern_recurred_after_remedy", "reboot_node") in [
        (v.subsystem, v.state, v.rule, v.action) for v in changed
    ]
    # the next rung, not another reset: a reboot, which the policy has wait for an operator
    assert run.plans()[-1] == ("reboot_node", "held", "approval")
    assert ("reset_gpu", "running", None) not in run.plans()


def test_a_reset_fixable_xid_beside_a_held_reboot_starts_it_and_the_node_comes_back(
    loop: Callable[..., Loop],
) -> None:
    """A GPU off the bus (XID 79: reboot) waits for an operator; a reset-class XID on the node's other GPU
    would drain the node anyway, so it starts the held reboot (the policy's starts_when_joined): one round
    ends both, and the node is validated and returned without a person."""
    run = loop()
    run.xid(FALLEN_OFF_THE_BUS, gpu=0)
    run.cycle()
    assert run.plans() == [("reboot_node", "held", "approval")]
    assert not run.out()  # held: nothing done yet
    time.sleep(0.05)
    run.xid(GSP_TIMEOUT, gpu=1)
    run.until(lambda: run.plans() == [("reboot_node", "done", None)], "rebooted, validated and returned")
    assert run.back()
    (joined,) = rows(
        run.live.db, "SELECT reason FROM remediation_events WHERE kind = 'decision' AND status = 'joined'"
    )
    assert "starts without one" in joined[0]
    assert rows(run.live.db, "SELECT approved_by FROM remediations") == [(None,)]
    assert sorted(
        rows(run.live.db, "SELECT gpu_uuid, remedy FROM gpu_remedies WHERE source = 'remediator'")
    ) == [
        (run.gpus[0], "reboot_node"),
        (run.gpus[1], "reboot_node"),
    ]


def test_a_repaired_gpus_node_is_validated_returned_and_its_held_escalation_withdrawn(
    loop: Callable[..., Loop],
) -> None:
    run = loop()
    gone_out_and_reset(run)
    time.sleep(0.05)
    run.xid()
    run.until(lambda: len(run.plans()) == 2, "escalated")
    assert run.out()
    with connect(run.live.db) as conn:  # as the API marks it (POST /api/v1/gpus/{uuid}/repairs)
        conn.execute(
            "SELECT * FROM mark_gpu_repaired(%s, 'repaired', 'oncall', 'new GSP firmware')", (run.gpus[0],)
        )
        conn.commit()
    run.until(lambda: run.plans()[-1] == ("reset_gpu", "done", None), "validated after the repair")
    assert run.back()
    assert run.plans() == [
        ("reset_gpu", "escalated", None),
        ("reboot_node", "withdrawn", "approval"),
        ("reset_gpu", "done", None),  # the validation the repair started: validate, return
    ]
    (withdrawn,) = rows(run.live.db, "SELECT reason FROM remediation_events WHERE status = 'withdrawn'")
    assert "repaired by oncall" in withdrawn[0]
    assert "moot" in withdrawn[0]
    assert rows(run.live.db, "SELECT steps FROM remediations WHERE id = 3") == [(["validate", "return"],)]


def test_a_dry_run_beside_the_live_run_decides_the_same_and_changes_nothing(
    loop: Callable[..., Loop],
) -> None:
    run = loop(dry_runs=1)
    gone_out_and_reset(run)
    run.until(lambda: run.plans() == [("reset_gpu", "done", None)], "validated and returned")
    assert run.back()
    live = rows(
        run.live.db, "SELECT decision_key, outcome FROM remediation_decisions WHERE NOT dry_run ORDER BY 1"
    )
    dry = rows(
        run.live.db, "SELECT decision_key, outcome FROM remediation_decisions WHERE dry_run ORDER BY 1"
    )
    assert live
    assert dry == live
    # the dry run's plan behaved as the live one: one plan, validated over the cycles, returned
    assert run.plans(dry_run=True) == [("reset_gpu", "done", None)]
    assert rows(run.live.db, "SELECT dry_run FROM remediation_ownership") == []  # all given back
    dry_actions = rows(
        run.live.db, "SELECT DISTINCT status FROM remediation_events WHERE dry_run AND kind = 'action'"
    )
    assert {s for (s,) in dry_actions} <= {"dry_run", "remedied"}  # it reached no scheduler and no node

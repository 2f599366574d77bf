"""The remediator against the real slurmctld and slurmd: a drain whose reason names the finding, waited for
while a job runs (draining, then drained), a resume once the node is validated; a drain someone else made,
or made again over the remediator's, is left as it was, reason and all; a GPU the mock fleet's compute
check still finds broken keeps its node drained."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.remediator.drivers.node_exec import Command
from services.remediator.drivers.slurm import SlurmDriver
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.remediation import (
    TRUE,
    Remediator,
    add_fleet,
    add_nodes,
    decide_all,
    returned,
    rows,
    verdict_finding,
)


def slurm(conf: Path, *args: str) -> str:
    done = subprocess.run(
        list(args),
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def state(conf: Path, node: str) -> tuple[str, str]:
    """sinfo's state word (`*` and the like dropped) and the reason of `node`."""
    word, _, reason = slurm(conf, "sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").partition("|")
    return word.rstrip("*~#!%$@^-+"), reason


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture
def idle_node(slurm_conf: Path) -> Iterator[Callable[[str], str]]:
    """A node of the real Slurm, idle before the test and resumed after it, whatever the test left."""
    used: list[str] = []

    def take(node: str) -> str:
        wait_for(lambda: state(slurm_conf, node)[0] == "idle", f"{node} idle")
        used.append(node)
        return node

    yield take
    for node in used:
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=resume"],
            env={**os.environ, "SLURM_CONF": str(slurm_conf)},
            capture_output=True,
            check=False,
        )
        wait_for(lambda node=node: state(slurm_conf, node)[0] == "idle", f"{node} idle again")  # type: ignore[misc]


def slurm_remediator(
    factory: Callable[..., Remediator], conf: Path, compute_check: Command = TRUE, *, fleet: bool = True
) -> Remediator:
    r = factory(
        dry_run=False,
        schedulers=[SlurmDriver(slurm_conf=conf)],
        commands={"reset_gpu": TRUE, "compute_check": compute_check},
    )
    if fleet:
        add_fleet(r.db, 40, names=lambda i: f"gpu-node-{i:02d}")  # 4 of them are Slurm's
    return r


def test_a_drain_names_the_finding_waits_for_the_job_and_resumes_after_validation(
    remediator_factory: Callable[..., Remediator],
    slurm_conf: Path,
    idle_node: Callable[[str], str],
    tmp_path: Path,
) -> None:
    node = idle_node("gpu-node-01")
    job = slurm(
        slurm_conf, "sbatch", "--parsable", "-w", node, "-o", str(tmp_path / "job.out"), "--wrap", "sleep 5"
    )
    wait_for(lambda: slurm(slurm_conf, "squeue", "-h", "-j", job, "-o", "%T") == "RUNNING", "the job running")
    r = slurm_remediator(remediator_factory, slurm_conf)
    decide_all(r, [verdict_finding(1, rule="xid_79")], dry_run=False)
    r.run_until_settled()
    word, reason = state(slurm_conf, node)
    assert word == "draining"  # the job still runs: no new work, and the plan waits
    assert reason == "gpu-health: xid_79 (remediation 1)"
    assert rows(r.db, "SELECT steps[step + 1] FROM remediations") == [("drain",)]
    wait_for(lambda: state(slurm_conf, node)[0] == "drained", "the job done, the node drained")
    r.run_until_settled()  # it looks again after the drain step's look_s
    assert rows(r.db, "SELECT steps[step + 1] FROM remediations") == [("validate",)]
    returned(r, node)
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]
    wait_for(lambda: state(slurm_conf, node) == ("idle", "none"), "resumed")
    drains = rows(r.db, "SELECT status, response FROM remediation_events WHERE step = 'drain' ORDER BY time")
    assert [s for s, _ in drains] == ["in_progress", "ok"]
    assert drains[0][1]["state"] == "draining"


def test_a_drain_someone_else_made_is_left_as_it_was(
    remediator_factory: Callable[..., Remediator], slurm_conf: Path, idle_node: Callable[[str], str]
) -> None:
    node = idle_node("gpu-node-00")
    slurm(slurm_conf, "scontrol", "update", f"nodename={node}", "state=drain", "reason=maintenance: fans")
    r = slurm_remediator(remediator_factory, slurm_conf)
    decide_all(r, [verdict_finding(0)], dry_run=False)
    r.run_until_settled()
    returned(r, node)
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]
    assert state(slurm_conf, node) == ("drained", "maintenance: fans")  # not resumed, reason untouched
    statuses = rows(r.db, "SELECT step, status FROM remediation_events WHERE kind = 'action' ORDER BY time")
    assert ("cordon", "not_owned") in statuses
    assert ("return", "not_owned") in statuses


def test_a_drain_an_operator_makes_over_the_remediators_is_theirs_and_never_resumed(
    remediator_factory: Callable[..., Remediator], slurm_conf: Path, idle_node: Callable[[str], str]
) -> None:
    node = idle_node("gpu-node-01")
    r = slurm_remediator(remediator_factory, slurm_conf)
    decide_all(r, [verdict_finding(1)], dry_run=False)
    r.run_until_settled()
    assert state(slurm_conf, node) == ("drained", "gpu-health: xid_79 (remediation 1)")
    # the operator takes the node over while it is validated: their reason, their node
    slurm(slurm_conf, "scontrol", "update", f"nodename={node}", "state=drain", "reason=rma: ticket 4711")
    returned(r, node)
    assert state(slurm_conf, node) == ("drained", "rma: ticket 4711")
    assert ("return", "not_owned") in rows(
        r.db, "SELECT step, status FROM remediation_events WHERE kind = 'action' ORDER BY time"
    )


def test_a_gpu_the_mock_fleets_compute_check_finds_still_broken_keeps_its_node_drained(
    remediator_factory: Callable[..., Remediator], slurm_conf: Path, idle_node: Callable[[str], str]
) -> None:
    """The check `make up` and compose configure (GPUHEALTH_REMEDIATOR__EXEC__COMPUTE_CHECK): the mock's
    POST /compute-check, which fails a GPU while a hard failure is active on it. The reset the remediator
    asked for cleared nothing, so the broken GPU's node stays drained; the healthy GPU's node returns."""
    broken_node, healthy_node = idle_node("gpu-node-00"), idle_node("gpu-node-01")
    with served_fleet(nodes=2, gpus=2, seed=5) as (fleet, mock):
        assert [n.hostname for n in fleet.nodes] == [broken_node, healthy_node]  # Slurm's nodes
        broken, healthy = fleet.nodes[0].gpus[1].uuid, fleet.nodes[1].gpus[0].uuid
        dbe = fleet.inject({"kind": "dbe", "gpu_uuid": broken})
        check = Command(url=f"{mock.admin_url}/compute-check")
        r = slurm_remediator(remediator_factory, slurm_conf, check, fleet=False)
        add_nodes(r.db, {n.hostname: [g.uuid for g in n.gpus] for n in fleet.nodes})
        add_fleet(r.db, 38, names=lambda i: f"spare-{i:02d}")  # the breaker's 10 %: 4 nodes may go out
        findings = [verdict_finding(0, uuid=broken, hostname=broken_node, rule="dbe")]
        decide_all(r, [*findings, verdict_finding(1, uuid=healthy, hostname=healthy_node)], dry_run=False)
        r.run_until_settled()
        returned(r, broken_node)
        returned(r, healthy_node)
    assert rows(r.db, "SELECT id, node, action, state, held_for FROM remediations ORDER BY id") == [
        (1, broken_node, "reset_gpu", "escalated", None),
        (2, healthy_node, "reset_gpu", "done", None),
        (3, broken_node, "reboot_node", "held", "approval"),
    ]
    assert state(slurm_conf, broken_node) == ("drained", "gpu-health: dbe (remediation 1)")
    assert state(slurm_conf, healthy_node) == ("idle", "none")
    ((reason, response),) = rows(
        r.db,
        "SELECT reason, response FROM remediation_events"
        " WHERE remediation_id = 1 AND step = 'validate' AND kind = 'action'",
    )
    assert reason.startswith("compute_check failed")
    said = response["runs"][-1]  # the mock's answer: the GPU, and the fault that failed it
    assert (said["status"], said["ok"]) == (409, False)
    for named in (broken, f'"id": {dbe.id}', '"kind": "dbe"'):
        assert named in said["said"]

"""The remediator against the real slurmctld and slurmd: a drain whose reason names the finding, waited for
while a job runs (draining, then drained), a resume once the node is validated; a drain someone else made
is left as it was, reason and all."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.remediator.drivers.slurm import SlurmDriver
from tests.helpers.remediation import TRUE, Remediator, add_fleet, decide_all, returned, rows, verdict_finding


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


def slurm_remediator(factory: Callable[..., Remediator], conf: Path) -> Remediator:
    r = factory(
        dry_run=False,
        schedulers=[SlurmDriver(slurm_conf=conf)],
        commands={"reset_gpu": TRUE, "compute_check": TRUE},
    )
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
    time.sleep(0.06)
    r.run_until_settled()
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

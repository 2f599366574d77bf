"""The schedulers `make services` starts for the remediator are the real thing, set up as it needs.

A kube-apiserver (built from its Go module) that authorises with RBAC, not AlwaysAllow: the
remediator's login has exactly what deploy/kubernetes/remediator-rbac.yaml grants. Slurm's own
daemons, one slurmd per node of the mock fleet, that drain with a reason and resume.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest


def kubectl_as(
    kubectl: Path, kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_apiserver_authorises_with_rbac(kubectl: Path, kube_admin: Path, kube_remediator: Path) -> None:
    admin = kubectl_as(kubectl, kube_admin, "auth", "can-i", "delete", "nodes")
    assert admin.stdout.strip() == "yes", admin.stderr
    for verb, resource in [("delete", "nodes"), ("get", "secrets"), ("create", "pods"), ("delete", "pods")]:
        refused = kubectl_as(kubectl, kube_remediator, "auth", "can-i", verb, resource)
        assert refused.stdout.strip() == "no", f"the remediator may {verb} {resource}"


def test_a_node_can_be_created_cordoned_and_deleted_by_the_admin(kubectl: Path, kube_admin: Path) -> None:
    name = f"test-node-{uuid.uuid4().hex[:8]}"
    node = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    created = kubectl_as(kubectl, kube_admin, "apply", "-f", "-", stdin=node)
    assert created.returncode == 0, created.stderr
    try:
        assert kubectl_as(kubectl, kube_admin, "cordon", name).returncode == 0
        spec = kubectl_as(kubectl, kube_admin, "get", "node", name, "-o", "jsonpath={.spec.unschedulable}")
        assert spec.stdout == "true"
    finally:
        kubectl_as(kubectl, kube_admin, "delete", "node", name)


def slurm(slurm_conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CONF": str(slurm_conf)}
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60, check=False)


def node_state(slurm_conf: Path, node: str) -> str:
    return slurm(slurm_conf, "sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()


def test_slurm_runs_a_node_per_mock_node_that_drains_with_a_reason_and_resumes(slurm_conf: Path) -> None:
    listed = slurm(slurm_conf, "sinfo", "-h", "-N", "-o", "%N").stdout.split()
    assert sorted(set(listed)) == [f"gpu-node-0{i}" for i in range(4)]
    node = "gpu-node-03"
    reason = f"gpu-health test {uuid.uuid4().hex[:6]}"
    drained = slurm(slurm_conf, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    assert drained.returncode == 0, drained.stderr
    try:
        assert node_state(slurm_conf, node) == "drained"
        assert reason in slurm(slurm_conf, "sinfo", "-h", "-R", "-n", node, "-o", "%E").stdout
        # resuming a node that is not drained is an error, as the remediator will meet it
        assert slurm(slurm_conf, "scontrol", "update", "nodename=gpu-node-02", "state=resume").returncode != 0
    finally:
        slurm(slurm_conf, "scontrol", "update", f"nodename={node}", "state=resume")
    deadline = time.monotonic() + 10
    while node_state(slurm_conf, node) != "idle":  # `idle*` for about a second after a resume
        assert time.monotonic() < deadline, node_state(slurm_conf, node)
        time.sleep(0.2)


@pytest.mark.parametrize(
    "args", [["nodename=gpu-node-01", "state=drain"], ["nodename=no-such-node", "state=drain", "reason=x"]]
)
def test_slurm_refuses_a_drain_without_a_reason_or_of_an_unknown_node(
    slurm_conf: Path, args: list[str]
) -> None:
    assert slurm(slurm_conf, "scontrol", "update", *args).returncode != 0
    assert node_state(slurm_conf, "gpu-node-01") == "idle"

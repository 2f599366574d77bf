"""How far the remediator's Kubernetes login can go, on the real API server: what RBAC grants it
(`kubectl auth can-i`), and what the admission policies (deploy/kubernetes/remediator-admission.yaml)
refuse of that: any change to a node without the GPU label, a NoExecute taint, another's taint, label or
annotation, and an eviction in a protected namespace. Each request is the remediator's own login (its
kubeconfig)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.remediator.drivers.base import DriverError
from services.remediator.drivers.kubeconfig import load_kubeconfig
from services.remediator.drivers.kubernetes import TAINT_KEY, KubernetesDriver
from services.remediator.policy import Policy
from tests.helpers.kube import KubeAdmin

MERGE = {"Content-Type": "application/merge-patch+json"}
OWN = {"key": TAINT_KEY, "value": "xid_79", "effect": "NoSchedule"}


@pytest.fixture
def remediator(kube_remediator: Path) -> Iterator[httpx.Client]:
    """The remediator's own login: its token, its RBAC, the policies that match its user."""
    access = load_kubeconfig(kube_remediator)
    with httpx.Client(base_url=access.server, verify=access.ssl_context, headers=access.headers) as client:
        yield client


def can_i(kubectl: Path, kubeconfig: Path, *what: str) -> str:
    done = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "auth", "can-i", *what],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip()


def test_kubectl_auth_can_i_says_what_rbac_grants_the_remediator(
    kube: KubeAdmin, kubectl: Path, kube_remediator: Path
) -> None:
    asked = {
        ("patch", "nodes"): "yes",
        ("get", "nodes"): "yes",
        ("list", "nodes"): "no",
        ("delete", "nodes"): "no",
        ("update", "nodes"): "no",  # patch only, never a whole replacement
        ("patch", "nodes", "--subresource=status"): "no",
        ("list", "pods", "--all-namespaces"): "yes",  # the drain finds a node's pods in any namespace
        ("get", "pods", "--all-namespaces"): "no",
        ("watch", "pods", "--all-namespaces"): "no",
        (
            "create",
            "pods",
            "--subresource=eviction",
            "-n",
            "default",
        ): "yes",  # narrowed by the admission policy below
        ("delete", "pods", "-n", "default"): "no",
        ("get", "secrets", "--all-namespaces"): "no",
        ("create", "validatingadmissionpolicies"): "no",
        ("delete", "validatingadmissionpolicybindings"): "no",
        ("patch", "clusterroles"): "no",
    }
    answers = {what: can_i(kubectl, kube_remediator, *what) for what in asked}
    assert answers == asked


def patch(client: httpx.Client, node: str, body: dict[str, Any]) -> int:
    return client.patch(f"/api/v1/nodes/{node}", json=body, headers=MERGE).status_code


def test_the_policy_lets_it_cordon_a_gpu_node_with_its_own_taint_and_nothing_more(
    kube: KubeAdmin, kube_nodes: Callable[[int], list[str]], remediator: httpx.Client
) -> None:
    (node,) = kube_nodes(1)
    theirs = kube.node(node)["spec"].get("taints") or []
    cordon = {
        "metadata": {"annotations": {"gpu-health.io/cordoned-by": "gpu-health-remediator"}},
        "spec": {"unschedulable": True, "taints": [*theirs, OWN]},
    }
    refused: dict[str, dict[str, Any]] = {
        "NoExecute": {"spec": {"taints": [*theirs, {**OWN, "effect": "NoExecute"}]}},
        "another key, NoSchedule": {"spec": {"taints": [*theirs, {**OWN, "key": "other.io/x"}]}},
        "another's taint removed": {"spec": {"taints": [OWN]}},
        "a label": {"metadata": {"labels": {"x": "y"}}},
        "the GPU label removed": {"metadata": {"labels": {"nvidia.com/gpu.present": None}}},
        "another's annotation": {"metadata": {"annotations": {"example.com/owner": "me"}}},
        "the provider id": {"spec": {"providerID": "aws:///eu-west-1a/i-0"}},
        "the pod CIDR": {"spec": {"podCIDR": "10.0.0.0/24"}},
    }
    assert {what: patch(remediator, node, body) for what, body in refused.items()} == dict.fromkeys(
        refused, 422
    )
    assert patch(remediator, node, cordon) == 200
    taken = kube.node(node)
    assert taken["spec"]["unschedulable"] is True
    assert OWN in taken["spec"]["taints"]
    back = {
        "metadata": {"annotations": {"gpu-health.io/cordoned-by": None}},
        "spec": {"unschedulable": None, "taints": theirs or None},
    }
    assert patch(remediator, node, back) == 200
    assert not kube.node(node)["spec"].get("unschedulable")


def test_it_cannot_change_a_node_without_the_gpu_label(
    kube: KubeAdmin, kube_nodes: Callable[[int], list[str]], remediator: httpx.Client, policy: Policy,
    kube_remediator: Path,
) -> None:  # fmt: skip
    (gpu_node,) = kube_nodes(1)
    control_plane = f"{gpu_node}-cp"
    kube.create_node(control_plane, gpu=False)
    try:
        answer = remediator.patch(
            f"/api/v1/nodes/{control_plane}", json={"spec": {"unschedulable": True}}, headers=MERGE
        )
        assert answer.status_code == 422
        assert "GPU nodes only" in answer.json()["message"]
        # the driver as the service builds it: the API server's refusal fails the step, never retried
        driver = KubernetesDriver(load_kubeconfig(kube_remediator), drain=policy.drain)
        try:
            with pytest.raises(DriverError) as refused:
                driver.take_out(control_plane, finding="forged", plan_id=1)
            assert not refused.value.retriable
            assert driver.take_out(gpu_node, finding="xid_79", plan_id=1).status == "ok"
        finally:
            driver.close()
        assert not kube.node(control_plane)["spec"].get("unschedulable")
    finally:
        kube.delete_node(control_plane)


def evict(client: httpx.Client, namespace: str, pod: str) -> int:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
        "deleteOptions": {"gracePeriodSeconds": 0},
    }
    return client.post(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", json=body).status_code


def test_it_cannot_evict_in_a_protected_namespace(
    kube: KubeAdmin, kube_nodes: Callable[[int], list[str]], remediator: httpx.Client
) -> None:
    (node,) = kube_nodes(1)
    ordinary, protected = kube.namespace(), kube.namespace("prot")
    kube.call(
        "PATCH",
        f"/api/v1/namespaces/{protected}",
        {"metadata": {"labels": {"gpu-health.io/protected": "true"}}},
        merge=True,
    )
    pod = f"p-{node}"
    for namespace in ("kube-system", protected, ordinary):
        kube.pod(namespace, pod, node)
    try:
        answers = {ns: evict(remediator, ns, pod) for ns in ("kube-system", protected, ordinary)}
        assert answers == {"kube-system": 422, protected: 422, ordinary: 201}
        assert kube.pods_on(node) == sorted([f"kube-system/{pod}", f"{protected}/{pod}"])
    finally:
        kube.call("DELETE", f"/api/v1/namespaces/kube-system/pods/{pod}", ok=(404,))

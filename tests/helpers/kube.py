"""Setting up the real kube-apiserver for a test, as its admin: nodes, namespaces, pods, PodDisruptionBudgets.

No controller runs beside the API server (no kubelet, scheduler or controller-manager),
so what they would do is done here: a pod's phase is patched to Running (budgets
count only running pods) and a budget's status is patched with the disruptions it
allows (nothing else computes it).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx

from evaluation.pipeline import wait_until
from services.remediator.drivers.kubeconfig import load_kubeconfig
from tests.paths import REPO

RBAC = REPO / "deploy" / "kubernetes" / "remediator-rbac.yaml"
ADMISSION = REPO / "deploy" / "kubernetes" / "remediator-admission.yaml"
REMEDIATOR = "gpuhealth-remediator"  # the user remediator.kubeconfig authenticates as
GPU_LABEL = "nvidia.com/gpu.present"


class KubeAdmin:
    def __init__(self, kubeconfig: Path) -> None:
        access = load_kubeconfig(kubeconfig)
        self.kubeconfig = kubeconfig
        self.client = httpx.Client(
            base_url=access.server, verify=access.ssl_context, headers=access.headers, timeout=30
        )

    def close(self) -> None:
        self.client.close()

    def call(
        self, method: str, path: str, body: Any = None, *, merge: bool = False, ok: tuple[int, ...] = ()
    ) -> Any:
        headers = {"Content-Type": "application/merge-patch+json"} if merge else {}
        response = self.client.request(method, path, json=body, headers=headers)
        if response.status_code >= 300 and response.status_code not in ok:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def apply_rbac(self, kubectl: Path) -> None:
        """The remediator's role and the admission policies that narrow it, exactly as the manifests have
        them (idempotent); returns once the API server enforces the policies."""
        done = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", "apply", "-f", str(RBAC), "-f", str(ADMISSION)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        self.wait_for_admission()

    def as_remediator(self, method: str, path: str, body: Any = None, **params: str) -> httpx.Response:
        """A request as the remediator's user (impersonated by the admin: its RBAC and policies apply)."""
        headers = {"Impersonate-User": REMEDIATOR}
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        return self.client.request(method, path, json=body, headers=headers, params=params)

    def wait_for_admission(self, deadline_s: float = 30.0) -> None:
        """Until a dry-run cordon of a node without the GPU label is refused: the policies are in force (the
        API server takes them up from its watch, a moment after they are created)."""
        name = f"probe-{uuid.uuid4().hex[:8]}"
        self.create_node(name, gpu=False)
        cordon = {"spec": {"unschedulable": True}}
        try:
            wait_until(
                lambda: (
                    self.as_remediator("PATCH", f"/api/v1/nodes/{name}", cordon, dryRun="All").status_code
                    == 422
                ),
                deadline_s,
                "the remediator's admission policies in force",
            )
        finally:
            self.delete_node(name)

    def create_node(self, name: str, *, gpu: bool = True) -> None:
        """A node; a GPU node (labelled as NVIDIA's GPU feature discovery labels one) unless `gpu` is False:
        the remediator's admission policy (deploy/kubernetes/remediator-admission.yaml) lets it change GPU
        nodes only."""
        meta: dict[str, Any] = {"name": name}
        if gpu:
            meta["labels"] = {GPU_LABEL: "true"}
        self.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta})

    def delete_node(self, name: str) -> None:
        self.call("DELETE", f"/api/v1/nodes/{name}", ok=(404,))

    def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/api/v1/nodes/{name}")
        return found

    def cordon(self, name: str) -> None:
        """Cordon as someone else would (kubectl cordon): no mark of the remediator's."""
        self.call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}}, merge=True)

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.call(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        return name

    def pod(
        self, namespace: str, name: str, node: str, *, app: str = "work", daemonset: bool = False
    ) -> None:
        """A pod bound to `node`, Running and Ready (as a kubelet would report it)."""
        meta: dict[str, Any] = {"name": name, "labels": {"app": app}}
        if daemonset:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "agent",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ]
        self.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
        # Ready too: a running pod that is not ready may be evicted whatever its budget says
        # (the default unhealthyPodEvictionPolicy, IfHealthyBudget)
        ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self.call(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": ready}, merge=True
        )

    def pods_on(self, node: str) -> list[str]:
        found = self.client.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"}).json()
        return sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in found.get("items", []))

    def budget(self, namespace: str, app: str, *, allowed: int) -> None:
        """A PodDisruptionBudget over the app's pods that allows `allowed` disruptions (its status set)."""
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        created = self.call(
            "POST",
            path,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": app},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
            },
        )
        self.allow(namespace, app, allowed, generation=int(created["metadata"].get("generation", 1)))

    def allow(self, namespace: str, app: str, allowed: int, generation: int = 1) -> None:
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{app}/status"
        self.call(
            "PATCH",
            path,
            {
                "status": {
                    "disruptionsAllowed": allowed,
                    "observedGeneration": generation,
                    "currentHealthy": 1,
                    "desiredHealthy": 1,
                    "expectedPods": 1,
                }
            },
            merge=True,
        )

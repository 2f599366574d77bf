"""The Kubernetes driver: cordon with a taint naming the finding, drain through the Eviction API, uncordon.

It talks to the API server's REST API with httpx and needs exactly the rights
deploy/kubernetes/remediator-rbac.yaml grants: nodes get/list/patch, pods list,
pods/eviction create. A cordon is the remediator's when the node carries the
annotation `gpu-health.io/cordoned-by`; a node someone else cordoned is left
cordoned and never marked. Patches carry the node's resourceVersion, so a
cordon made by someone else between the read and the write is a conflict
(read again), never overwritten. `spec.taints` is replaced whole by a merge
patch, so every patch sends the node's other taints back as they were.

A drain evicts each pod on the node (DaemonSet and mirror pods, and pods of
`skip` namespaces, stay); the Eviction API answers 429 while a
PodDisruptionBudget forbids it, and the pod is tried again at the next look.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote

import httpx

from ..policy import Drain
from .base import DriverError, DriverResult, SchedulerName
from .kubeconfig import KubeAccess

log = logging.getLogger(__name__)

MARK = "gpu-health.io/cordoned-by"
OWNER = "gpu-health-remediator"
PLAN = "gpu-health.io/remediation"
FINDING = "gpu-health.io/finding"
TAINT_KEY = "gpu-health.io/finding"
_CONFLICT_TRIES = 5


def taint_value(finding: str) -> str:
    """A finding as a taint value (a label value: up to 63 of [A-Za-z0-9-_.], alphanumeric at the ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", finding)[:63].strip("-_.")
    return value or "finding"


def _failure(response: httpx.Response, what: str) -> DriverError:
    try:
        message = str(response.json().get("message", ""))[:300]
    except ValueError:
        message = response.text[:300]
    retriable = response.status_code >= 500 or response.status_code == 429
    return DriverError(f"{what}: {response.status_code} {message}", retriable=retriable)


class KubernetesDriver:
    name: SchedulerName = "kubernetes"

    def __init__(self, access: KubeAccess, *, drain: Drain, timeout_s: float = 10.0) -> None:
        self.drain_policy = drain
        self.client = httpx.Client(
            base_url=access.server, verify=access.ssl_context, headers=access.headers, timeout=timeout_s
        )

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.client.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise DriverError(f"{what}: the API server did not answer: {e}", retriable=True) from e

    def node(self, node: str) -> dict[str, Any]:
        response = self._call("GET", f"/api/v1/nodes/{quote(node, safe='')}", f"read node {node}")
        if response.status_code != 200:
            raise _failure(response, f"read node {node}")
        found: dict[str, Any] = response.json()
        return found

    def _patch(self, node: str, body: dict[str, Any], what: str) -> bool:
        """Merge-patch `node`; False on a conflict (the node changed since it was read)."""
        response = self._call(
            "PATCH",
            f"/api/v1/nodes/{quote(node, safe='')}",
            what,
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code == 409:
            return False
        if response.status_code != 200:
            raise _failure(response, what)
        return True

    def take_out(self, node: str, *, finding: str, plan_id: int) -> DriverResult:
        for _ in range(_CONFLICT_TRIES):
            current = self.node(node)
            meta, spec = current.get("metadata", {}), current.get("spec", {})
            annotations = meta.get("annotations") or {}
            if annotations.get(MARK) == OWNER:
                return DriverResult(
                    "ok", {"cordoned": True, "already": True, "taint": annotations.get(FINDING)}
                )
            if spec.get("unschedulable"):
                return DriverResult(
                    "not_owned",
                    {"cordoned": True},
                    "cordoned by someone else: left as it is, never uncordoned by the remediator",
                )
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
            taint = {"key": TAINT_KEY, "value": taint_value(finding), "effect": "NoSchedule"}
            body = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {MARK: OWNER, PLAN: str(plan_id), FINDING: taint["value"]},
                },
                "spec": {"unschedulable": True, "taints": [*taints, taint]},
            }
            if self._patch(node, body, f"cordon node {node}"):
                return DriverResult("ok", {"cordoned": True, "taint": taint})
        raise DriverError(f"cordon node {node}: it kept changing under the patch", retriable=True)

    def put_back(self, node: str) -> DriverResult:
        for _ in range(_CONFLICT_TRIES):
            current = self.node(node)
            meta, spec = current.get("metadata", {}), current.get("spec", {})
            annotations = meta.get("annotations") or {}
            if annotations.get(MARK) != OWNER:
                if not spec.get("unschedulable"):
                    return DriverResult("ok", {"uncordoned": True, "already": True})
                return DriverResult(
                    "not_owned",
                    {"cordoned": True},
                    "the cordon does not carry the remediator's mark: left cordoned",
                )
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
            body = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {MARK: None, PLAN: None, FINDING: None},
                },
                "spec": {"unschedulable": None, "taints": taints or None},
            }
            if self._patch(node, body, f"uncordon node {node}"):
                return DriverResult("ok", {"uncordoned": True})
        raise DriverError(f"uncordon node {node}: it kept changing under the patch", retriable=True)

    def pods(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to `node`, across namespaces (paged)."""
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"fieldSelector": f"spec.nodeName={node}", "limit": 500}
        while True:
            response = self._call("GET", "/api/v1/pods", f"list pods of {node}", params=params)
            if response.status_code != 200:
                raise _failure(response, f"list pods of {node}")
            body = response.json()
            found += body.get("items") or []
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return found
            params["continue"] = token

    def _evict(self, namespace: str, pod: str) -> str:
        """evicted, blocked (a PodDisruptionBudget), or gone."""
        eviction: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        if self.drain_policy.grace_period_s is not None:
            eviction["deleteOptions"] = {"gracePeriodSeconds": self.drain_policy.grace_period_s}
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/eviction"
        response = self._call("POST", path, f"evict {namespace}/{pod}", json=eviction)
        if response.status_code in (200, 201):
            return "evicted"
        if response.status_code == 404:
            return "gone"
        if response.status_code == 429:
            return "blocked"
        if response.status_code == 500 and "more than one" in response.text.lower():
            return "blocked"  # several budgets cover the pod: the API server refuses to choose
        raise _failure(response, f"evict {namespace}/{pod}")

    def drain(self, node: str, *, past_deadline: bool) -> DriverResult:
        evicted: list[str] = []
        blocked: list[str] = []
        left: list[str] = []  # terminating
        skipped = 0
        forced: list[str] = []
        for pod in self.pods(node):
            meta = pod.get("metadata") or {}
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            owners = {str(o.get("kind")) for o in meta.get("ownerReferences") or []}
            mode = self.drain_policy.mode(namespace)
            if "DaemonSet" in owners or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
                skipped += 1
                continue
            if mode == "skip":
                skipped += 1
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and meta.get(
                "deletionTimestamp"
            ):
                continue
            outcome = "terminating" if meta.get("deletionTimestamp") else self._evict(namespace, name)
            where = f"{namespace}/{name}"
            if outcome == "gone":
                continue
            if outcome == "evicted":
                evicted.append(where)  # looked at again next time: gone once its grace period is over
            elif past_deadline and mode == "force":
                forced.append(where)
            else:
                (blocked if outcome == "blocked" else left).append(where)
        response = {
            "evicted": evicted,
            "blocked": blocked,
            "terminating": left,
            "forced": forced,
            "skipped": skipped,
        }
        if not blocked and not left and not evicted:
            return DriverResult("ok", response)
        if past_deadline and (blocked or left):
            return DriverResult(
                "failed",
                response,
                f"{len(blocked) + len(left)} pods still on the node at the drain's deadline"
                f" (PodDisruptionBudgets: {blocked[:5]})",
            )
        return DriverResult("in_progress", response)

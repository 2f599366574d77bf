"""The remediator against the real kube-apiserver, authorised by RBAC with the role the manifest grants:
cordon with a taint naming the finding, drain through the Eviction API (a PodDisruptionBudget blocks it
until the deadline), uncordon only what it cordoned, a restart in the middle of a drain, a validation
that fails and keeps the node out, a mass failure of 1,000 nodes that takes out no node past the bound,
and a role that can do nothing else."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.remediator.drivers.kubeconfig import load_kubeconfig
from services.remediator.drivers.kubernetes import MARK, OWNER, TAINT_KEY, KubernetesDriver
from services.remediator.drivers.node_exec import Command
from services.remediator.findings import Finding
from services.remediator.policy import Policy
from tests.helpers.kube import RBAC, KubeAdmin
from tests.helpers.remediation import (
    FALSE,
    TRUE,
    Remediator,
    add_fleet,
    decide_all,
    returned,
    rows,
    verdict_finding,
)


def our_taint(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == TAINT_KEY]


def finding_on(names: list[str], index: int = 0, **changes: Any) -> Finding:
    return verdict_finding(index, hostname=names[index], **changes)


def fleet_of(r: Remediator, names: list[str]) -> None:
    """The nodes in the inventory, in a fleet of 40 (the breaker's 10 %: 4 nodes may be taken out)."""
    add_fleet(r.db, 40, names=lambda i: names[i] if i < len(names) else f"spare-{i}")


@pytest.fixture
def on_kube(
    remediator_factory: Callable[..., Remediator],
    kube_driver: Callable[..., KubernetesDriver],
    policy: Policy,
) -> Callable[..., Remediator]:
    """Builds a live remediator whose scheduler is the API server, as the service builds it: the driver's
    drain and the policy's are one (no grace period, and `drain`'s changes); the node's commands reset the
    GPU and run the compute check (`compute_check`, passing by default)."""

    def build(*, compute_check: Command = TRUE, **drain: Any) -> Remediator:
        drain = {"grace_period_s": 0, **drain}
        return remediator_factory(
            dry_run=False,
            schedulers=[kube_driver(**drain)],
            commands={"reset_gpu": TRUE, "compute_check": compute_check},
            policy_changes={"drain": policy.drain.model_copy(update=drain)},
        )

    return build


def acting(r: Remediator, names: list[str], *findings: Finding) -> Remediator:
    """`r` with the nodes in its inventory, the findings (by default: the first node's) decided live, and
    its plans stepped as far as they go."""
    fleet_of(r, names)
    decide_all(r, list(findings) or [finding_on(names)], dry_run=False)
    r.run_until_settled()
    return r


def test_the_role_can_do_what_the_manifest_grants_and_nothing_else(
    kube: KubeAdmin, kube_remediator: Path, kube_nodes: Callable[[int], list[str]]
) -> None:
    (node,) = kube_nodes(1)
    namespace = kube.namespace()
    kube.pod(namespace, "p", node)
    access = load_kubeconfig(kube_remediator)
    with httpx.Client(base_url=access.server, verify=access.ssl_context, headers=access.headers) as client:
        allowed = [
            client.get(f"/api/v1/nodes/{node}"),
            client.patch(  # what the admission policy leaves it: its own annotation (test_admission.py)
                f"/api/v1/nodes/{node}",
                json={"metadata": {"annotations": {"gpu-health.io/remediation": "1"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ),
            client.get("/api/v1/pods"),
            client.post(
                f"/api/v1/namespaces/{namespace}/pods/p/eviction",
                json={
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": "p", "namespace": namespace},
                    "deleteOptions": {"gracePeriodSeconds": 0},
                },
            ),
        ]
        assert [r.status_code for r in allowed] == [200, 200, 200, 201]
        refused = [
            client.get("/api/v1/nodes"),  # it reads the nodes it names, never lists the cluster's
            client.delete(f"/api/v1/nodes/{node}"),
            client.get("/api/v1/secrets"),
            client.get(f"/api/v1/namespaces/{namespace}/secrets"),
            client.post(
                f"/api/v1/namespaces/{namespace}/pods",
                json={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "q"},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            ),
            client.delete(f"/api/v1/namespaces/{namespace}/pods/p"),
            client.get(f"/api/v1/namespaces/{namespace}/pods/p"),  # list, not get
            client.post(
                "/api/v1/namespaces",
                json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}},
            ),
            client.get("/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            client.put(f"/api/v1/nodes/{node}", json=kube.node(node)),  # patch only, never replace
        ]
        assert [r.status_code for r in refused] == [403] * len(refused)


def triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every combination the rules allow."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# What RBAC's defaults let any authenticated user do (system:basic-user, system:discovery,
# system:public-info-viewer): ask who it is and what it may do, and read the API's discovery.
EVERY_USER = {
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
    ("authorization.k8s.io", "selfsubjectrulesreviews", "create"),
    ("authentication.k8s.io", "selfsubjectreviews", "create"),
}


def test_the_api_server_says_the_role_allows_exactly_the_manifests_rules(
    kube: KubeAdmin, kube_remediator: Path
) -> None:
    """Not a sample of refusals: the API server's own account of everything the login may do in a
    namespace and cluster-wide (a SelfSubjectRulesReview) is the manifest's three rules and no more."""
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ClusterRole"]
    granted = triples(role["rules"])
    assert granted == {  # the rights the issue names, and nothing else
        ("", "nodes", "get"), ("", "nodes", "patch"),
        ("", "pods", "list"), ("", "pods/eviction", "create"),
    }  # fmt: skip
    access = load_kubeconfig(kube_remediator)
    with httpx.Client(base_url=access.server, verify=access.ssl_context, headers=access.headers) as client:
        review = client.post(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            json={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": kube.namespace()},
            },
        )
    assert review.status_code == 201, review.text
    status = review.json()["status"]
    assert status["incomplete"] is False  # RBAC answers for all of it: no other authoriser
    assert triples(status["resourceRules"]) == granted | EVERY_USER
    assert {v for rule in status["nonResourceRules"] for v in rule["verbs"]} == {"get"}


def test_a_node_is_cordoned_tainted_drained_validated_and_uncordoned(
    on_kube: Callable[..., Remediator], kube: KubeAdmin, kube_nodes: Callable[[int], list[str]]
) -> None:
    names = kube_nodes(1)
    node = names[0]
    namespace, system = kube.namespace(), kube.namespace("kube-sys")
    kube.pod(namespace, "trainer", node)
    kube.pod(namespace, "agent", node, daemonset=True)
    kube.pod(system, "dns", node)
    r = acting(on_kube(namespaces={system: "skip"}), names, finding_on(names, rule="xid_79"))
    out = kube.node(node)
    assert out["spec"]["unschedulable"] is True
    assert our_taint(out) == [{"key": TAINT_KEY, "value": "xid_79", "effect": "NoSchedule"}]
    assert out["metadata"]["annotations"][MARK] == OWNER
    assert {t["key"] for t in out["spec"]["taints"]} >= {
        "node.kubernetes.io/not-ready"
    }  # others' taints kept
    # evicted: the workload; left: the DaemonSet's pod and the skipped namespace's
    assert kube.pods_on(node) == sorted([f"{namespace}/agent", f"{system}/dns"])
    assert rows(r.db, "SELECT steps[step + 1] FROM remediations") == [("validate",)]
    returned(r, node)
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]
    back = kube.node(node)
    assert not back["spec"].get("unschedulable")
    assert our_taint(back) == []
    assert MARK not in (back["metadata"].get("annotations") or {})
    assert rows(r.db, "SELECT count(*) FROM remediation_ownership") == [(0,)]


def test_a_node_someone_else_cordoned_stays_cordoned(
    on_kube: Callable[..., Remediator], kube: KubeAdmin, kube_nodes: Callable[[int], list[str]]
) -> None:
    names = kube_nodes(1)
    kube.cordon(names[0])  # an operator, or another system, took it out first
    r = acting(on_kube(), names)
    returned(r, names[0])
    assert rows(r.db, "SELECT state FROM remediations") == [("done",)]
    node = kube.node(names[0])
    assert node["spec"]["unschedulable"] is True  # still cordoned: not the remediator's to undo
    assert MARK not in (node["metadata"].get("annotations") or {})
    assert our_taint(node) == []
    statuses = rows(r.db, "SELECT step, status FROM remediation_events WHERE kind = 'action' ORDER BY time")
    assert ("cordon", "not_owned") in statuses
    assert ("return", "not_owned") in statuses


def test_a_budget_blocks_the_drain_until_its_deadline_and_the_node_stays_out(
    on_kube: Callable[..., Remediator], kube: KubeAdmin, kube_nodes: Callable[[int], list[str]]
) -> None:
    names = kube_nodes(2)
    strict, lenient = kube.namespace(), kube.namespace()
    for namespace, node in ((strict, names[0]), (lenient, names[1])):
        kube.pod(namespace, "db-0", node, app="db")
        kube.budget(namespace, "db", allowed=0)
    r = acting(
        on_kube(deadline_s=1, namespaces={lenient: "force"}),
        names,
        finding_on(names, 0),
        finding_on(names, 1),
    )
    blocked = rows(
        r.db, "SELECT response FROM remediation_events WHERE step = 'drain' AND status = 'in_progress'"
    )
    assert {tuple(b[0]["blocked"]) for b in blocked} == {(f"{strict}/db-0",), (f"{lenient}/db-0",)}
    r.clock.advance(1.1)  # past the drain's deadline_s
    r.run_until_settled()
    assert rows(r.db, "SELECT node, state, steps[step + 1] FROM remediations ORDER BY node") == [
        (names[0], "failed", "drain"),  # evict: the budget held, the node stays cordoned for a person
        (names[1], "running", "validate"),  # force: the plan went on without the pod
    ]
    assert kube.pods_on(names[0]) == [f"{strict}/db-0"]
    assert kube.node(names[0])["spec"]["unschedulable"] is True
    (reason,) = rows(
        r.db, "SELECT reason FROM remediation_events WHERE kind = 'outcome' AND status = 'failed'"
    )[0]
    assert "PodDisruptionBudgets" in reason


def test_a_restart_in_the_middle_of_a_drain_goes_on_where_it_was(
    on_kube: Callable[..., Remediator], kube: KubeAdmin, kube_nodes: Callable[[int], list[str]]
) -> None:
    names = kube_nodes(1)
    namespace = kube.namespace()
    kube.pod(namespace, "db-0", names[0], app="db")
    kube.pod(namespace, "web-0", names[0], app="web")
    kube.budget(namespace, "db", allowed=0)
    first = acting(on_kube(), names)
    (started,) = rows(first.db, "SELECT step_started_at FROM remediations")[0]
    assert kube.pods_on(names[0]) == [f"{namespace}/db-0"]  # web evicted, db held by its budget
    first.executor.steps.schedulers[0].close()  # the process dies mid-drain
    kube.allow(namespace, "db", 1)  # the budget's other replica became ready meanwhile
    second = on_kube()
    second.clock.advance(1.0)  # down for a second: the drain's clock (and its deadline) runs on meanwhile
    second.run_until_settled()
    assert kube.pods_on(names[0]) == []
    assert rows(second.db, "SELECT steps[step + 1] FROM remediations") == [("validate",)]
    cordons = rows(second.db, "SELECT status FROM remediation_events WHERE step = 'cordon'")
    assert cordons == [("ok",)]  # taken out once, not again after the restart
    drained = rows(second.db, "SELECT seconds FROM remediation_events WHERE step = 'drain' AND status = 'ok'")
    assert drained[0][0] >= 1.0  # timed from the first look, before the restart
    assert drained[0][0] <= (second.clock() - started).total_seconds()


def test_a_failed_validation_keeps_the_node_cordoned_and_escalates(
    on_kube: Callable[..., Remediator], kube: KubeAdmin, kube_nodes: Callable[[int], list[str]]
) -> None:
    names = kube_nodes(1)
    r = acting(on_kube(compute_check=FALSE), names)
    returned(r, names[0])
    assert rows(r.db, "SELECT action, state, held_for FROM remediations ORDER BY id") == [
        ("reset_gpu", "escalated", None),
        ("reboot_node", "held", "approval"),
    ]
    node = kube.node(names[0])
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][MARK] == OWNER  # still the remediator's: the next plan takes it on
    assert rows(r.db, "SELECT remediation_id FROM remediation_ownership") == [(1,)]


@pytest.mark.timeout(600)
def test_a_mass_failure_of_1000_nodes_takes_out_none_past_the_bound(
    remediator_factory: Callable[..., Remediator],
    kube: KubeAdmin,
    kube_nodes: Callable[[int], list[str]],
    kube_driver: Callable[..., KubernetesDriver],
    policy: Policy,
) -> None:
    names = kube_nodes(1000)
    unlimited = policy.for_action("reset_gpu").model_copy(update={"max_per_window": None})
    r = remediator_factory(
        dry_run=False,
        schedulers=[kube_driver(grace_period_s=0)],
        policy_changes={"actions": {**policy.actions, "reset_gpu": unlimited}},
    )
    add_fleet(r.db, 1000, gpus=1, names=lambda i: names[i])
    decide_all(r, [verdict_finding(i, hostname=names[i]) for i in range(1000)], dry_run=False)
    r.executor.batch = 1000
    r.run_until_settled(rounds=5)
    bound = r.policy.breaker.bound(1000)
    cordoned = [n for n in names if kube.node(n)["spec"].get("unschedulable")]
    assert len(cordoned) == bound == 10
    assert rows(r.db, "SELECT count(*) FROM remediations WHERE state = 'held' AND held_for = 'breaker'") == [
        (990,)
    ]
    assert rows(r.db, "SELECT breaker FROM remediation_control WHERE NOT dry_run") == [("open",)]

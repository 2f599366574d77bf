"""The remediator's integration fixtures: the policy, and executors built as the service builds them over the
test's schema (their drivers real: the API server, Slurm, processes)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.remediator.drivers.base import SchedulerDriver
from services.remediator.drivers.kubeconfig import load_kubeconfig
from services.remediator.drivers.kubernetes import KubernetesDriver
from services.remediator.drivers.node_exec import Command, NodeExec
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap
from services.remediator.policy import Policy, load_policy
from services.remediator.steps import Steps
from shared.settings.common import DatabaseSettings
from tests.helpers.kube import KubeAdmin
from tests.helpers.remediation import PlanClock, Remediator


@pytest.fixture
def policy() -> Policy:
    return load_policy()


@pytest.fixture
def remediator_factory(migrated: DatabaseSettings, policy: Policy) -> Iterator[Callable[..., Remediator]]:
    """Builds executors over the test's schema: dry-run or live, with the given drivers and node commands."""
    built: list[SchedulerDriver] = []
    executors: list[Executor] = []
    clock = PlanClock()  # one for the test: a restarted executor's time goes on from its predecessor's

    def build(
        *,
        dry_run: bool = True,
        schedulers: list[SchedulerDriver] | None = None,
        commands: dict[str, Command] | None = None,
        policy_changes: dict[str, Any] | None = None,
        nodes: NodeMap | None = None,
    ) -> Remediator:
        chosen = policy.model_copy(update=policy_changes or {})
        built.extend(schedulers or [])
        node_map = nodes or NodeMap()
        steps = Steps(
            policy=chosen,
            schedulers=schedulers or [],
            node_exec=NodeExec(commands or {}),  # type: ignore[arg-type]
            nodes=node_map,
            look_s=0.05,
        )
        executor = Executor(
            db=migrated, policy=chosen, steps=steps, dry_run=dry_run, retry_s=0.05, clock=clock
        )
        executors.append(executor)
        return Remediator(migrated, chosen, executor, node_map, clock)

    yield build
    for scheduler in built:
        scheduler.close()
    for executor in executors:
        executor.close()


@pytest.fixture(scope="session")
def kube(kube_admin: Path, kubectl: Path) -> Iterator[KubeAdmin]:
    """The real API server's admin, with the remediator's role applied exactly as the manifest has it."""
    admin = KubeAdmin(kube_admin)
    admin.apply_rbac(kubectl)
    yield admin
    admin.close()


@pytest.fixture
def kube_nodes(kube: KubeAdmin) -> Iterator[Callable[[int], list[str]]]:
    """Creates uniquely named nodes in the API server; deletes them after the test."""
    made: list[str] = []

    def create(count: int) -> list[str]:
        prefix = f"n{uuid.uuid4().hex[:6]}"
        names = [f"{prefix}-{i:04d}" for i in range(count)]
        for name in names:
            kube.create_node(name)
        made.extend(names)
        return names

    yield create
    for name in made:
        kube.delete_node(name)


@pytest.fixture
def kube_driver(kube_remediator: Path, kube: KubeAdmin, policy: Policy) -> Callable[..., KubernetesDriver]:
    """The Kubernetes driver as the service builds it: the remediator's own login, its RBAC role only."""

    def build(**drain: Any) -> KubernetesDriver:
        return KubernetesDriver(load_kubeconfig(kube_remediator), drain=policy.drain.model_copy(update=drain))

    return build

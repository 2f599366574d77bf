"""The remediator's integration fixtures: the policy, and executors built as the service builds them over the
test's schema (their drivers real: the API server, Slurm, processes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.remediator.drivers.base import SchedulerDriver
from services.remediator.drivers.node_exec import Command, NodeExec
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap
from services.remediator.policy import Policy, load_policy
from services.remediator.steps import Steps
from shared.config import DatabaseSettings
from tests.helpers.remediation import Remediator


@pytest.fixture
def policy() -> Policy:
    return load_policy()


@pytest.fixture
def remediator_factory(migrated: DatabaseSettings, policy: Policy) -> Iterator[Callable[..., Remediator]]:
    """Builds executors over the test's schema: dry-run or live, with the given drivers and node commands."""
    built: list[SchedulerDriver] = []

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
        executor = Executor(db=migrated, policy=chosen, steps=steps, dry_run=dry_run, retry_s=0.05)
        return Remediator(migrated, chosen, executor, node_map)

    yield build
    for scheduler in built:
        scheduler.close()

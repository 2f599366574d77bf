"""`make up` starts what running needs and installs only that; `make test` brings the rest.

Read from `make -n` (what each target would run), so a dependency added to `up` that drags in the
schedulers, the test tools or the development packages fails here, not on a user's first run.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.paths import REPO

# What only the tests (or a live remediator) need: the schedulers, the test tools, the dev packages.
NOT_FOR_RUNNING = (
    "kube.sh",
    "slurm.sh",
    "start schedulers",
    "install-tools.sh",
    "install-docker.sh",
    "--dev",
)


def planned(*goals: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", *goals],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_make_up_starts_kafka_timescaledb_and_the_pipeline_only() -> None:
    plan = planned("up")
    assert "scripts/services.sh start core" in plan
    assert "scripts/pyenv.sh" in plan
    assert "scripts/stack.sh up" in plan
    assert not [step for step in NOT_FOR_RUNNING if step in plan], plan
    assert "services.sh start\n" not in plan
    assert "services.sh start all" not in plan


def test_a_live_remediator_brings_its_schedulers() -> None:
    assert "GPUHEALTH_REMEDIATOR_MODE=live scripts/stack.sh up" in planned("up", "REMEDIATOR=live")
    stack = (REPO / "scripts" / "stack.sh").read_text()
    live = stack[stack.index("    live)") : stack.index(";;", stack.index("    live)"))]
    assert '"$here/services.sh" start schedulers' in live


@pytest.mark.parametrize("goal", ["test", "test-integration"])
def test_the_tests_bring_the_schedulers_the_tools_and_the_dev_packages(goal: str) -> None:
    plan = planned(goal)
    assert "scripts/services.sh start\n" in plan
    assert "scripts/install-tools.sh" in plan
    assert "scripts/pyenv.sh --dev" in plan


def test_lint_has_its_tools() -> None:
    assert "scripts/pyenv.sh --dev" in planned("lint")

"""`make up` and compose give the remediator's validation a real compute check: the mock fleet's; `make up
REMEDIATOR=live` makes the stack's remediator act, with nothing else to edit."""

from __future__ import annotations

import os
import subprocess
import tomllib

import pytest
import yaml

from scripts.supervise import expand
from services.mock_dcgm.settings import MockSettings
from services.remediator.drivers.node_exec import Command
from services.remediator.settings import RemediatorSection, RemediatorSettings
from tests.paths import REPO

PREFIX = "GPUHEALTH_REMEDIATOR__EXEC__"
CHECK = f"{PREFIX}COMPUTE_CHECK"


def test_make_up_points_the_compute_check_at_its_mock_fleet() -> None:
    spec = tomllib.loads((REPO / "deploy" / "local-stack.toml").read_text())["process"]
    environ = {"GPUHEALTH_MOCK_ADMIN_PORT": "19399", "GPUHEALTH_REMEDIATOR_METRICS_PORT": "19503"}
    admin_port = expand(spec["mock"]["env"]["GPUHEALTH_MOCK__ADMIN_PORT"], environ)
    command = Command.model_validate_json(expand(spec["remediator"]["env"][CHECK], environ))
    assert command.url == f"http://127.0.0.1:{admin_port}/compute-check"
    assert command.per_gpu  # each GPU checked, each named in the record


def test_compose_points_the_compute_check_reset_and_reboot_at_its_mock_fleet() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    environment = services["remediator"]["environment"]
    admin_port = services["mock"]["environment"].get("GPUHEALTH_MOCK__ADMIN_PORT", MockSettings().admin_port)
    for name, path in (
        (CHECK, "compute-check"),
        (f"{PREFIX}RESET_GPU", "reset-gpu"),
        (f"{PREFIX}REBOOT", "reboot"),
    ):
        command = Command.model_validate_json(environment[name])
        assert command.url == f"http://mock:{admin_port}/{path}"


def remediator_env(mode: str | None, **more: str) -> dict[str, str]:
    """The stack's remediator's settings as `make up [REMEDIATOR=mode]` gives them (scripts/env.sh)."""
    done = subprocess.run(
        ["bash", "-c", f"source {REPO}/scripts/env.sh && env -0"],
        env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin",
             **({"GPUHEALTH_REMEDIATOR_MODE": mode} if mode else {}), **more},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    environ = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    spec = tomllib.loads((REPO / "deploy" / "local-stack.toml").read_text())["process"]
    return {k: expand(v, environ) for k, v in spec["remediator"]["env"].items()}


def settings_of(env: dict[str, str]) -> RemediatorSection:
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("GPUHEALTH_")]:
            patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        return RemediatorSettings().remediator


def test_a_dry_run_without_the_schedulers_reaches_for_none() -> None:
    """`make up` starts no scheduler: stack.sh then says so, and the dry run records without reading them."""
    cfg = settings_of(remediator_env(None, GPUHEALTH_REMEDIATOR_SCHEDULERS="false"))
    assert cfg.dry_run
    assert not cfg.kubernetes.enabled
    assert not cfg.slurm.enabled


def test_make_up_is_a_dry_run_unless_remediator_live_makes_it_act_on_its_own_schedulers_and_mock() -> None:
    for mode, dry_run in ((None, True), ("dry-run", True), ("live", False)):
        env = remediator_env(mode)
        with pytest.MonkeyPatch.context() as patch:
            for key in [k for k in os.environ if k.startswith("GPUHEALTH_")]:
                patch.delenv(key)
            for key, value in env.items():
                patch.setenv(key, value)
            cfg = RemediatorSettings().remediator
        assert cfg.dry_run is dry_run, mode
        assert cfg.kubernetes.enabled
        assert cfg.slurm.enabled
        assert cfg.kubernetes.kubeconfig is not None
        assert cfg.kubernetes.kubeconfig.name == "remediator.kubeconfig"
        assert cfg.slurm.conf is not None
        assert cfg.slurm.conf.parts[-2:] == ("etc", "slurm.conf")
        admin = f"http://127.0.0.1:{MockSettings().admin_port}"
        assert {op: (c.url, c.per_gpu) for op, c in cfg.exec.items()} == {
            "reset_gpu": (f"{admin}/reset-gpu", True),
            "reboot": (f"{admin}/reboot", False),
            "compute_check": (f"{admin}/compute-check", True),
        }

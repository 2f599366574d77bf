"""`make up` and compose give the remediator's validation a real compute check: the mock fleet's."""

from __future__ import annotations

import tomllib

import yaml

from services.mock_dcgm.__main__ import MockSettings
from services.remediator.drivers.node_exec import Command
from shared.supervise import expand
from tests.paths import REPO

CHECK = "GPUHEALTH_REMEDIATOR__EXEC__COMPUTE_CHECK"


def test_make_up_points_the_compute_check_at_its_mock_fleet() -> None:
    spec = tomllib.loads((REPO / "deploy" / "local-stack.toml").read_text())["process"]
    environ = {"GPUHEALTH_MOCK_ADMIN_PORT": "19399", "GPUHEALTH_REMEDIATOR_METRICS_PORT": "19503"}
    admin_port = expand(spec["mock"]["env"]["GPUHEALTH_MOCK__ADMIN_PORT"], environ)
    command = Command.model_validate_json(expand(spec["remediator"]["env"][CHECK], environ))
    assert command.url == f"http://127.0.0.1:{admin_port}/compute-check"
    assert command.per_gpu  # each GPU checked, each named in the record


def test_compose_points_the_compute_check_at_its_mock_fleet() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    command = Command.model_validate_json(services["remediator"]["environment"][CHECK])
    admin_port = services["mock"]["environment"].get("GPUHEALTH_MOCK__ADMIN_PORT", MockSettings().admin_port)
    assert command.url == f"http://mock:{admin_port}/compute-check"

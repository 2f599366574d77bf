"""docker-compose.yml against the Compose Specification's JSON schema, and its wiring."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from services.api.settings import ApiSettings
from services.collector.__main__ import CollectorSettings
from services.mock_dcgm.__main__ import MockDcgmSettings
from services.scorer.__main__ import ScorerSettings
from services.sink.__main__ import SinkSettings
from shared.config import Settings

REPO = Path(__file__).resolve().parents[2]
SPEC = Path(
    os.environ.get("GPUHEALTH_COMPOSE_SPEC", REPO.parent / "shared" / "reference" / "compose-spec.json")
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    assert SPEC.is_file(), f"Compose spec not found at {SPEC}; set GPUHEALTH_COMPOSE_SPEC"
    # The spec declares draft-07 (without the trailing "#" the library looks for).
    jsonschema.Draft7Validator(json.loads(SPEC.read_text())).validate(compose)


def test_every_dependency_waits_for_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


SETTINGS = {
    "mock": MockDcgmSettings, "collector-0": CollectorSettings, "collector-1": CollectorSettings,
    "collector-2": CollectorSettings, "collector-3": CollectorSettings, "collector-gpu": CollectorSettings,
    "collector-nvml": CollectorSettings, "sink": SinkSettings, "scorer": ScorerSettings, "api": ApiSettings,
}  # fmt: skip


def test_every_service_command_is_a_real_service(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        command = service.get("command", [])
        if command[:2] == ["python", "-m"]:
            module = command[2]
            assert (REPO / module.replace(".", "/") / "__main__.py").exists(), f"{name}: no {module}"
            if module.startswith("services."):
                assert SETTINGS.get(name, Settings) is not Settings or module.startswith("shared."), name


def test_app_environment_names_real_settings(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        sections = SETTINGS.get(name, Settings).model_fields
        for var in service.get("environment", {}):
            if not var.startswith("GPUHEALTH_"):
                continue
            section, _, field = var.removeprefix("GPUHEALTH_").lower().partition("__")
            assert section in sections, f"{name}: {var} names no settings section"
            model = sections[section].annotation
            assert model is not None
            assert field in model.model_fields, f"{name}: {var} names no setting"


def test_prometheus_scrapes_every_service(compose: dict[str, Any]) -> None:
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = " ".join(str(job) for job in scrape["scrape_configs"])
    for name, service in compose["services"].items():
        if (
            service.get("command", [])[:3] == ["python", "-m", "services.collector"]
            and "profiles" not in service
        ):
            assert f"{name}:9500" in targets
    for job in ("mock:9399", "'sink'", "scorer:9502", "api:8000"):
        assert job in targets

"""docker-compose.yml: valid for the real `docker compose`, wired to real settings, runnable by its images."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.scorer.__main__ import ScorerSettings
from shared.gpu.dcgm import FIELDS
from shared.gpu.dcgm_counters import COUNTERS_CSV, render
from shared.settings.common import Settings
from shared.settings.env import accepted_names, unknown_variables
from tests.helpers.image_files import SERVICE_SETTINGS, app_image_misses, image_files
from tests.paths import REPO

OVERRIDE = REPO / "deploy" / "docker" / "compose.local-images.yml"
LOCAL = str(OVERRIDE.relative_to(REPO))


def docker_cli() -> str:
    """Trixie's CLI that scripts/install-docker.sh installs (`make test` runs it), else PATH's."""
    found = os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else None)
    found = found or shutil.which("docker")
    assert found, "no docker CLI: run scripts/install-docker.sh install (make test does)"
    return found


def docker_compose_config(*args: str) -> subprocess.CompletedProcess[str]:
    # No variable from the caller's shell may change what is validated.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "COMPOSE_"))}
    return subprocess.run(
        [docker_cli(), "compose", "--project-directory", str(REPO), *args, "config", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


@pytest.mark.parametrize(
    "files",
    [
        ["-f", "docker-compose.yml"],
        ["-f", "docker-compose.yml", "--profile", "gpu", "--profile", "gpu-nvml"],
        ["-f", "docker-compose.yml", "-f", LOCAL],
        ["-f", "docker-compose.yml", "-f", LOCAL, "--profile", "gpu", "--profile", "grafana"],
    ],
    ids=["default", "gpu-profiles", "local-images", "local-images-all-profiles"],
)  # fmt: skip
def test_docker_compose_accepts_the_files(files: list[str]) -> None:
    done = docker_compose_config(*files)
    assert done.returncode == 0, done.stderr
    assert "WARN" not in done.stderr, done.stderr


def test_docker_compose_refuses_a_broken_file(tmp_path: Path) -> None:
    # The check above is a real validation, not a YAML parse: an unknown key fails it.
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  x:\n    image: busybox\n    comand: [true]\n")
    done = docker_compose_config("-f", str(broken))
    assert done.returncode != 0
    assert "comand" in done.stderr


def test_every_dependency_waits_for_a_healthcheck(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


SETTINGS = SERVICE_SETTINGS


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the project's own image (built from the Dockerfile)."""
    return {name: s for name, s in compose["services"].items() if "build" in s}


def test_every_app_service_runs_what_its_image_holds(compose: dict[str, Any]) -> None:
    files = image_files((REPO / "Dockerfile").read_text(), REPO)
    services = app_services(compose)
    assert {"setup", "mock", "sink", "scorer", "api"} <= set(services)
    for name, service in services.items():
        misses = app_image_misses(service, SETTINGS.get(name, Settings), files, REPO)
        assert not misses, f"{name}: the image lacks {misses}"


def test_the_image_check_catches_the_missing_config_folder(compose: dict[str, Any]) -> None:
    # The defect this check exists for: an image without config/ lets the scorer start
    # and exit 2 at once (no health rules file).
    dockerfile = (REPO / "Dockerfile").read_text()
    without_config = "\n".join(line for line in dockerfile.splitlines() if "COPY config" not in line)
    assert without_config != dockerfile
    misses = app_image_misses(
        compose["services"]["scorer"], ScorerSettings, image_files(without_config, REPO), REPO
    )
    assert misses == ["/app/config/health-rules.toml"]


def test_mounted_files_exist_in_the_repository(compose: dict[str, Any]) -> None:
    override: dict[str, Any] = yaml.safe_load(OVERRIDE.read_text().replace("!override", ""))
    for source in (compose, override):
        for name, service in source["services"].items():
            for volume in service.get("volumes", []):
                host = str(volume).split(":", 1)[0]
                if host.startswith("."):
                    assert (REPO / host).exists(), f"{name} mounts {host}, which is not in the repository"


def test_app_environment_names_real_settings(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        exact, open_prefixes = accepted_names(SETTINGS.get(name, Settings))
        names = [var for var in service.get("environment", {}) if var.startswith("GPUHEALTH_")]
        assert unknown_variables(names, exact, open_prefixes) == {}, f"{name}: names no setting"


def test_the_database_keeps_the_image_init_scripts_and_is_checked_over_tcp(compose: dict[str, Any]) -> None:
    db = compose["services"]["timescaledb"]
    targets = [str(v).split(":")[1] for v in db["volumes"]]
    assert "/docker-entrypoint-initdb.d" not in targets, "a folder mounted over the image's own init scripts"
    assert any(t.startswith("/docker-entrypoint-initdb.d/") for t in targets)
    check = " ".join(db["healthcheck"]["test"])
    assert re.search(r"pg_isready .*-h 127\.0\.0\.1", check), "a socket check passes during initialisation"


def test_the_one_shot_setup_retries(compose: dict[str, Any]) -> None:
    command = " ".join(compose["services"]["setup"]["command"])
    assert "until python -m $$step" in command
    assert "shared.plumbing.migrate shared.plumbing.topic_admin" in command


def test_the_dcgm_exporter_is_checked_without_curl_and_names_the_node(compose: dict[str, Any]) -> None:
    exporter = compose["services"]["dcgm-exporter"]
    check = " ".join(exporter["healthcheck"]["test"])
    assert "curl" not in check
    assert "wget" not in check
    assert "/dev/tcp/127.0.0.1/9400" in check
    # The node's host name, not the container id, labels the exporter's series and NVML's samples.
    for name in ("dcgm-exporter", "collector-gpu", "collector-nvml"):
        assert compose["services"][name]["uts"] == "host", name


def test_prometheus_scrapes_the_node_exporters_and_every_service(compose: dict[str, Any]) -> None:
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    nodes = jobs["dcgm"]["static_configs"][0]["targets"]
    assert nodes == [f"mock:{9400 + i}" for i in range(4)]
    targets = " ".join(str(job) for job in scrape["scrape_configs"])
    for name, service in compose["services"].items():
        if (
            service.get("command", [])[:3] == ["python", "-m", "services.collector"]
            and "profiles" not in service
        ):
            assert f"{name}:9500" in targets
    for job in ("mock:9399", "'sink'", "'scorer'", "remediator:9503", "api:8000"):
        assert job in targets


def test_profiled_services_are_scraped_only_when_they_exist(compose: dict[str, Any]) -> None:
    # A static target for a service of an inactive profile would be reported down forever.
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    static = " ".join(str(job.get("static_configs", "")) for job in scrape["scrape_configs"])
    found_by_name = " ".join(str(job.get("dns_sd_configs", "")) for job in scrape["scrape_configs"])
    for name, service in compose["services"].items():
        if "profiles" in service and name != "grafana":
            assert f"'{name}:" not in static, f"{name} is scraped even without its profile"
            assert f"'{name}'" in found_by_name, f"{name} is not scraped with its profile"


def test_the_exporter_counters_cover_every_field_the_scorer_reads(compose: dict[str, Any]) -> None:
    assert COUNTERS_CSV.read_text() == render(), "stale: run python -m shared.gpu.dcgm_counters"
    rows = [line.split(",") for line in render().splitlines() if line and not line.startswith("#")]
    assert all(len(row) == 3 for row in rows), "a help text with a comma breaks dcgm-exporter's parser"
    exported = {row[0].strip(): row[1].strip() for row in rows}
    assert exported == {f.name: f.prom_type.value for f in FIELDS}
    scorer_sources = [*(REPO / "services" / "scorer").glob("*.py"), REPO / "shared/store/verdict_inputs.py"]
    scorer_code = " ".join(p.read_text() for p in scorer_sources)  # its SQL lives in the data-access package
    read_by_scorer = {f.name for f in FIELDS if re.search(rf"\b{f.sample_field}", scorer_code)}
    assert {
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_SLOWDOWN_TEMP",
    } <= read_by_scorer <= set(exported)  # fmt: skip
    exporter = compose["services"]["dcgm-exporter"]
    mounted = {v.split(":")[1] for v in exporter["volumes"] if v.startswith("./deploy/dcgm-exporter/")}
    assert exporter["environment"]["DCGM_EXPORTER_COLLECTORS"] in mounted


def test_the_override_leaves_no_registry_image_to_pull() -> None:
    # Every service `make compose-test` starts runs a local image (a new service of the
    # project's image needs its line in the override, or CI would try a registry).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "COMPOSE_"))}
    for profiles in ([], ["--profile", "gpu", "--profile", "gpu-nvml"]):
        done = subprocess.run(
            [docker_cli(), "compose", "--project-directory", str(REPO), "-f", "docker-compose.yml",
             "-f", LOCAL, *profiles, "config", "--format", "json"],
            capture_output=True, text=True, timeout=60, check=True, cwd=REPO, env=env,
        )  # fmt: skip
        services = json.loads(done.stdout)["services"]
        for name, service in services.items():
            if name == "dcgm-exporter":  # NVIDIA's exporter: only on a real GPU node, never in CI
                continue
            assert service["image"].startswith("gpu-health-local/"), f"{name} runs {service['image']}"
            if "build" in service:
                assert service["build"]["args"]["PYTHON_IMAGE"] == "gpu-health-local/python:3.11", name


def test_the_stacks_read_the_mock_fleets_kernel_log_as_a_node_reads_its_own(compose: dict[str, Any]) -> None:
    """`make up` and compose: each collector reads its mock nodes' kernel logs beside their exporters."""
    import tomllib

    stack = tomllib.loads((REPO / "deploy" / "local-stack.toml").read_text())["process"]["collector"]
    assert stack["env"]["GPUHEALTH_COLLECTOR__KERNEL_LOG"] == "mock"
    collectors = [
        s for name, s in compose["services"].items()
        if name.startswith("collector-") and s["environment"]["GPUHEALTH_COLLECTOR__SOURCE"] == "mock"
    ]  # fmt: skip
    assert collectors
    assert all(s["environment"]["GPUHEALTH_COLLECTOR__KERNEL_LOG"] == "mock" for s in collectors)

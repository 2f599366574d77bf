"""`python -m services.mock_dcgm`: serve a simulated fleet until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from pydantic import Field

from shared.plumbing.errors import GpuHealthError
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service
from shared.settings.common import Section, Settings

from .clock import SimClock, iso, parse_sim_start
from .faults import FaultError
from .fleet import DEFAULT_MODELS, ComputeCheck, Fleet, FleetSpec
from .profiles import MODELS
from .server import MockServer

log = logging.getLogger("services.mock_dcgm")


class MockSettings(Section):
    """GPUHEALTH_MOCK__*: the fleet's shape, where it listens, and its clock."""

    nodes: int = Field(default=4, ge=1, le=4096)
    """Simulated nodes, each answering on its own port."""
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    """GPUs per node."""
    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    """GPU models, cycled across nodes (`h100-sxm`, `a100-sxm4-80gb`, `v100-sxm2-32gb`)."""
    seed: int = 42
    """The same seed gives the same fleet: the same UUIDs, and the same readings at the same simulated
    times."""
    bind: str = "127.0.0.1"
    """Address the nodes and the admin endpoint listen on."""
    base_port: int = Field(default=9400, ge=0, le=65535)
    """Node *i* answers on this port + *i*."""
    admin_port: int = Field(default=9399, ge=0, le=65535)
    """The admin endpoint: faults, ground truth, the fleet, the mock's own `/metrics`."""
    hostname_prefix: str = Field(default="gpu-node-", pattern=r"^[A-Za-z0-9._-]{1,40}$")
    """Node host names are this and a two-digit number."""
    driver_version: str = "550.90.07"
    """The driver version the nodes report."""
    workload_labels: bool = True
    """Label each GPU's series with its simulated job's container, namespace and pod, as dcgm-exporter
    does with Kubernetes mapping."""
    speed: float = Field(default=1.0, gt=0, le=1_000_000)
    """Simulated seconds per real second; other than 1, each sample line carries its simulated timestamp."""
    sim_start: str = "now"
    """Where the simulated clock starts: `now`, a time before now (`-24h`, `-90m`: `-<n>[smhd]`) or an
    ISO-8601 time."""
    compute_check: ComputeCheck = "hard_failure"
    """What fails `POST /compute-check` on a GPU (the remediator's validation): an active `hard_failure`
    (a DBE, a failed remap, a fall off the bus, a critical XID), `any_fault` active but a heavy workload,
    or `nothing`. A fault stays until a remedy that fixes it (`POST /reset-gpu`, `POST /reboot`), a repair,
    its duration or `DELETE /faults/<id>` ends it."""
    scenario: Path | None = None
    """A JSON file of scheduled faults:
    `{"faults": [{"kind": ..., "node": ..., "gpu": ..., "after_s": ...}]}`."""


class MockDcgmSettings(Settings):
    mock: MockSettings = Field(default_factory=MockSettings)


def build(settings: MockSettings) -> tuple[Fleet, MockServer]:
    unknown = [m for m in settings.models if m not in MODELS]
    if unknown:
        raise FaultError(f"unknown GPU models {unknown}; known: {', '.join(MODELS)}")
    clock = SimClock(start_s=parse_sim_start(settings.sim_start, time.time()), speed=settings.speed)
    fleet = Fleet(
        FleetSpec(
            nodes=settings.nodes,
            gpus_per_node=settings.gpus_per_node,
            models=tuple(settings.models),
            seed=settings.seed,
            hostname_prefix=settings.hostname_prefix,
            driver_version=settings.driver_version,
            workload_labels=settings.workload_labels,
        ),
        clock,
    )
    if settings.scenario:
        fleet.load_scenario(settings.scenario)
    server = MockServer(
        fleet,
        bind=settings.bind,
        base_port=settings.base_port,
        admin_port=settings.admin_port,
        timestamps=settings.speed != 1.0,
        compute_check=settings.compute_check,
    )
    return fleet, server


def main() -> int:
    settings = start_service(MockDcgmSettings, "mock_dcgm")
    if settings is None:
        return 2
    with ServiceRun("mock_dcgm", settings.shutdown) as life:
        try:
            fleet, server = build(settings.mock)
        except (GpuHealthError, OSError) as e:
            log.error("cannot start the mock fleet: %s", e)
            return 1
        life.export_otlp(server.registry)
        life.enter_context(server)
        log.info(
            "mock fleet serving",
            extra={
                "nodes": len(fleet.nodes),
                "gpus": sum(len(n.gpus) for n in fleet.nodes),
                "first_node": server.node_url(0),
                "admin": server.admin_url,
                "sim_time": iso(fleet.clock.now()),
                "speed": fleet.clock.speed,
            },
        )
        server.run(life.stop)
        log.info("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())

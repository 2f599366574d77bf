"""The mock fleet its settings describe (`build`, for its `main` and the tests), and the service
`python -m services.mock_dcgm` runs (`MockDcgmService`)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from shared.plumbing.running import Loop, ServiceRun

from .clock import SimClock, iso, parse_sim_start
from .faults import FaultError
from .fleet import Fleet, FleetSpec
from .profiles import MODELS
from .server import MockServer
from .settings import MockDcgmSettings, MockSettings

log = logging.getLogger("services.mock_dcgm")


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


class MockDcgmService:
    """Serves the simulated fleet: each node's dcgm-exporter, and the admin endpoint."""

    def __init__(self, settings: MockDcgmSettings) -> None:
        self.settings = settings

    def start(self, life: ServiceRun) -> Loop:
        fleet, server = build(self.settings.mock)
        return Serving(fleet, server, life)

    def stopped(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Serving:
    """The built fleet's loop: its server entered into `life`, served until `stop`."""

    fleet: Fleet
    server: MockServer
    life: ServiceRun

    def run(self, stop: threading.Event) -> None:
        fleet, server = self.fleet, self.server
        self.life.export_otlp(server.registry)
        self.life.enter_context(server)
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
        server.run(stop)
        log.info("stopping")

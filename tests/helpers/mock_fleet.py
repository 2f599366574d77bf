"""Helpers to drive a mock fleet on a hand-moved clock, to read one GPU's value from its page, and to
serve a fleet on free ports for a test."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer

T0 = 1_800_000_000.0  # a fixed simulated start, so tests never depend on the wall clock
H100, A100, V100 = 0, 2, 3  # node indices in the default model cycle
GPU = 5


class HandClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_fleet(*, nodes: int = 4, gpus: int = 8, seed: int = 7) -> tuple[Fleet, HandClock]:
    hand = HandClock()
    spec = FleetSpec(nodes=nodes, gpus_per_node=gpus, seed=seed)
    return Fleet(spec, SimClock(start_s=T0, speed=1.0, monotonic=hand)), hand


def reading(fleet: Fleet, node: int, name: str, gpu: int = GPU) -> float:
    text = fleet.scrape(node, timestamps=False)[0]
    uuid = fleet.nodes[node].gpus[gpu].uuid
    match = re.search(rf'^{name}\{{[^}}]*UUID="{uuid}"[^}}]*\}} (\S+)$', text, re.M)
    assert match, f"no {name} line for {uuid}"
    return float(match[1])


@contextmanager
def served_fleet(
    *, nodes: int, gpus: int, seed: int, speed: float = 1.0, timestamps: bool = False
) -> Iterator[tuple[Fleet, MockServer]]:
    """A mock fleet on the wall clock, its nodes and admin API served on free ports for the block."""
    fleet = Fleet(
        FleetSpec(nodes=nodes, gpus_per_node=gpus, seed=seed), SimClock(start_s=time.time(), speed=speed)
    )
    with MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=timestamps) as server:
        server.start()
        yield fleet, server

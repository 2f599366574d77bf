"""Helpers to drive a mock fleet on a hand-moved clock."""

from __future__ import annotations

from services.mock_dcgm.fleet import Fleet, FleetSpec, SimClock

T0 = 1_800_000_000.0  # a fixed simulated start, so tests never depend on the wall clock


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

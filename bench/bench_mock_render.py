"""Mock exporter: time to advance and render a scrape, next to prometheus_client parsing it.

The reference is the same exposition parsed by prometheus_client's text parser
in the same run: a scrape that costs less than one parse of its own output is
cheap enough for any collector that has to read it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from bench._common import best_of, report
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec


class Steps:
    """A clock that moves 15 simulated seconds per call, like a 15 s scrape interval."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 15.0
        return self.t


def measure(nodes: int, label: str) -> None:
    fleet = Fleet(FleetSpec(nodes=nodes, gpus_per_node=8, seed=1), SimClock(start_s=0, monotonic=Steps()))
    fleet.inject({"kind": "sbe_storm", "node": 0, "gpu": 0})
    texts = [fleet.scrape(n, timestamps=False)[0] for n in range(nodes)]

    def render() -> None:
        for n in range(nodes):
            fleet.scrape(n, timestamps=False)

    def parse() -> None:
        for text in texts:
            for _ in text_string_to_metric_families(text):
                pass

    t_render = best_of(5, render) * 1000
    t_parse = best_of(5, parse) * 1000
    report(f"{label} render ms/scrape", t_render, "ms", "prometheus_client parse of it", t_parse)


def main() -> int:
    measure(1, "node of 8 GPUs")
    measure(128, "fleet of 1,024 GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the Andon callback costs a training step: a tick that is not due, and a check when one is.

A tick between checks is a monotonic clock read, measured next to an empty
per-step hook call. A check is the GPU read plus the Andon rules, measured next
to the source's read alone, on the fake NVML so the figure is the library's
own cost (on a real GPU the NVML read itself dominates: see the README).
"""

from __future__ import annotations

import sys

from bench._common import best_of, report
from gpuhealth.training import Andon, AndonChecker, GpuMonitor
from shared.fakes.scripted_nvml import ScriptedNvml

STEPS = 200_000
CHECKS = 2_000


def main() -> int:
    nvml = ScriptedNvml()
    andon = Andon(monitor=GpuMonitor(nvml=nvml, devices=[0, 1]), checker=AndonChecker(), every_s=3600)
    andon.check_now()  # the next one is an hour away: every tick below is "not due"

    def hook() -> bool:
        return False

    def empty_steps() -> None:
        for _ in range(STEPS):
            hook()

    def ticking_steps() -> None:
        for _ in range(STEPS):
            andon.tick()

    base = best_of(5, empty_steps)
    ticks = best_of(5, ticking_steps)
    report("tick (not due)", ticks / STEPS * 1e9, "ns/step", "empty hook call", base / STEPS * 1e9)

    def source_reads() -> None:
        for _ in range(CHECKS):
            andon.monitor.source.read()

    def checks() -> None:
        for _ in range(CHECKS):
            andon.check_now()

    reads = best_of(3, source_reads)
    full = best_of(3, checks)
    report(
        "check (read + rules, 2 GPUs)", full / CHECKS * 1e6, "µs", "source read alone", reads / CHECKS * 1e6
    )
    andon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

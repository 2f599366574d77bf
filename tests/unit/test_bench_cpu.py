"""bench.cpu: CPU time by party from /proc, which the sink bench's ceiling is computed from."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.cpu import MACHINE, CpuMeter, _process_cpu


def spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_busy_process_is_charged_its_cpu_and_the_machine_at_least_as_much() -> None:
    meter = CpuMeter(pids={"me": lambda: [os.getpid()]})
    meter.start()
    spin(0.3)
    used = meter.stop()
    assert 0.25 <= used["me"] <= 1.0
    # the machine's busy time includes this process's (less any of it a hypervisor stole)
    assert used[MACHINE] >= 0.8 * used["me"]


def test_processes_are_found_by_name_and_one_born_meanwhile_counts_from_zero() -> None:
    name = Path(sys.executable).name[:15]  # comm is at most 15 characters
    meter = CpuMeter(names={"pythons": name})
    meter.start()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.process_time()+0.3\nwhile time.process_time()<t: pass\n"
         "time.sleep(5)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while (_process_cpu(child.pid) or 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = meter.stop()
    finally:
        child.kill()
        child.wait()
    assert used["pythons"] >= 0.25  # the child's whole CPU, though it was not there at start


def test_a_vanished_or_bogus_process_reads_as_absent() -> None:
    assert _process_cpu(2**22 + 7) is None
    meter = CpuMeter(pids={"ghost": lambda: [2**22 + 7]})
    meter.start()
    assert meter.stop()["ghost"] == 0.0

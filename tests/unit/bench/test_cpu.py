"""bench.cpu: CPU time by party from /proc (the sink bench's ceiling is computed from it), and resident
memory (the collector cost bench's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.cpu import MACHINE, CpuMeter, process_cpu, process_rss_mb
from evaluation.pipeline import wait_until


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
    # the child spins for 0.3 s of CPU, then waits for its stdin to close
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nt=time.process_time()+0.3\n"
         "while time.process_time()<t: pass\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: (process_cpu(child.pid) or 0.0) >= 0.3, 10, "the child's CPU")
        used = meter.stop()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    assert used["pythons"] >= 0.25  # the child's whole CPU, though it was not there at start


def test_a_vanished_or_bogus_process_reads_as_absent() -> None:
    assert process_cpu(2**22 + 7) is None
    meter = CpuMeter(pids={"ghost": lambda: [2**22 + 7]})
    meter.start()
    assert meter.stop()["ghost"] == 0.0


def test_the_resident_memory_grows_with_what_a_process_holds() -> None:
    before = process_rss_mb(os.getpid())
    held = bytearray(64 * 1024 * 1024)
    held[::4096] = b"x" * len(held[::4096])  # touch every page: resident, not only reserved
    after = process_rss_mb(os.getpid())
    assert before is not None
    assert after is not None
    assert after - before >= 60
    assert process_rss_mb(2**22 + 7) is None

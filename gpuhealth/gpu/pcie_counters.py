"""PCIe traffic from NVML's byte counters, which are 32 bits wide on current drivers.

`NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `..._RX_BYTES` cost ~0.1 ms each to read,
where `nvmlDeviceGetPcieThroughput` samples for 20 ms per call. But on the
recorded H100 (driver 580) they are unsigned 32-bit values that wrap every
4 GiB: at the 3.6 GB/s a host-to-device copy loop drives, that is about once a
second, so one reading per 10 s poll cannot tell 0.2 GB/s from 0.6 GB/s.

So a sampler thread reads the two counters of every GPU often enough that no
counter can wrap twice between two readings, and folds each difference
(modulo 2^32) into a 64-bit total; a poll's rate is the growth of that total
since the previous poll. The sampling period adapts to the traffic: the
busiest counter may move at most 1/8 of its range between samples, within
[20 ms, 1 s]; idle GPUs cost one read a second. Where a driver gives 64-bit
counters, nothing wraps and the period stays at its maximum.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
FASTEST_S, SLOWEST_S = 0.02, 1.0
_MOVE_PER_SAMPLE = 1 / 8  # of the counter's range, at the rate last seen


@dataclass(slots=True)
class _Counter:
    raw: int  # the last value NVML gave
    bits: int  # its width: 32 (wraps every 4 GiB) or 64
    total: int = 0  # bytes since the first sample, wraps undone
    at_us: int = 0  # the driver's timestamp of the last sample
    rate: float = 0.0  # bytes/s over the last sampling interval
    polled_total: int | None = None  # the total at the previous poll
    polled_us: int = 0


class PcieTraffic:
    """64-bit byte totals per (GPU, direction), from samples of wrapping counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[int, str], _Counter] = {}

    def sample(self, gpu: int, direction: str, raw: int, bits: int, at_us: int) -> None:
        """Fold one counter reading in (`at_us`: when the driver read it, in µs)."""
        with self._lock:
            c = self._counters.get((gpu, direction))
            if c is None or c.bits != bits:
                self._counters[(gpu, direction)] = _Counter(raw=raw, bits=bits, at_us=at_us)
                return
            if at_us <= c.at_us:
                return  # the driver's cached value: nothing new
            moved = (raw - c.raw) % (1 << bits)
            c.rate = moved * 1e6 / (at_us - c.at_us)
            c.total += moved
            c.raw, c.at_us = raw, at_us

    def poll_rate(self, gpu: int, direction: str) -> int | None:
        """Bytes/s since this GPU's previous poll; None until two polls have seen the counter."""
        with self._lock:
            c = self._counters.get((gpu, direction))
            if c is None:
                return None
            before, before_us = c.polled_total, c.polled_us
            c.polled_total, c.polled_us = c.total, c.at_us
            if before is None or c.at_us <= before_us:
                return None
            return round((c.total - before) * 1e6 / (c.at_us - before_us))

    def period_s(self) -> float:
        """How long the sampler may wait before the busiest 32-bit counter could wrap twice."""
        with self._lock:
            busiest = max(
                (c.rate / (1 << c.bits) for c in self._counters.values() if c.bits <= 32), default=0.0
            )
        if busiest <= 0:
            return SLOWEST_S
        return min(SLOWEST_S, max(FASTEST_S, _MOVE_PER_SAMPLE / busiest))


class PcieSampler:
    """A daemon thread calling `read_all` (which feeds a PcieTraffic) at the traffic's period."""

    def __init__(self, traffic: PcieTraffic, read_all: Callable[[], None]) -> None:
        self.traffic, self._read_all = traffic, read_all
        self._stop = threading.Event()
        self.sweeps = 0
        self._thread = threading.Thread(target=self._run, name="pcie-counters", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._read_all()
            except Exception:  # a sampler that dies would leave only per-poll (wrapping) rates
                log.exception("PCIe counter sweep failed; trying again next period")
            self.sweeps += 1
            self._stop.wait(max(0.0, self.traffic.period_s() - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

"""The mock fleet's simulated time: its clock, where it starts, a simulated time as the topics write it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

from gpuhealth.contract.wire_time import wire_time

from .faults import FaultError

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_sim_start(text: str, now: float) -> float:
    """`now`, an ISO-8601 time, or a time before now such as `-24h` or `-90m`."""
    if text == "now":
        return now
    match = _RELATIVE.match(text)
    if match:
        return now - float(match[1]) * _UNIT_S[match[2]]
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise FaultError(f"sim_start {text!r} is not 'now', -<n>[smhd] or an ISO-8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class SimClock:
    """Simulated epoch seconds: starts at `start_s` and runs `speed` times faster than real time."""

    def __init__(
        self, *, start_s: float, speed: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < speed <= 1_000_000:
            raise FaultError("speed must be above 0 and at most 1,000,000")
        self.start_s, self.speed, self._monotonic = start_s, speed, monotonic
        self._real0 = monotonic()

    def now(self) -> float:
        return self.start_s + (self._monotonic() - self._real0) * self.speed


def iso(t: float) -> str:
    """A simulated time (epoch seconds) as every topic writes a time, to the millisecond."""
    at = datetime.fromtimestamp(t, UTC)
    return wire_time(at.replace(microsecond=at.microsecond // 1000 * 1000))

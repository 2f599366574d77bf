"""One XID, one event: reconciles the places an XID is seen and keeps event times unique.

The same XID can reach the collector twice: from the GPU source (NVML's
event set, dcgm-exporter's counts) and from the kernel log. Each origin sees
every XID, so an occurrence matches at most one of another origin's with the
same GPU and code within `window_s`; a match is the same XID and no new
event. Two XIDs of one code from one origin are two events, however close.

`gpu_events` is keyed by (GPU, time, kind), so each XID event of a GPU gets
a time strictly after the previous one (+1 ms where two fall in the same
millisecond, the contract's resolution).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

_TICK = timedelta(milliseconds=1)


@dataclass(slots=True)
class _Seen:
    at: datetime
    code: int
    origin: str
    matched: bool = False


class XidLedger:
    def __init__(self, *, window_s: float = 30.0, keep: int = 512) -> None:
        self.window = timedelta(seconds=window_s)
        self.keep = keep
        self._recent: dict[str, deque[_Seen]] = {}
        self._last: dict[str, datetime] = {}

    def admit(self, gpu_uuid: str, code: int, origin: str, at: datetime) -> datetime | None:
        """The time for a new XID event, or None when another origin already reported this one."""
        recent = self._recent.setdefault(gpu_uuid, deque(maxlen=self.keep))
        for seen in recent:
            if (
                not seen.matched
                and seen.code == code
                and seen.origin != origin
                and abs(seen.at - at) <= self.window
            ):
                seen.matched = True
                return None
        at = at.replace(microsecond=at.microsecond // 1000 * 1000)
        last = self._last.get(gpu_uuid)
        if last is not None and at <= last:
            at = last + _TICK
        self._last[gpu_uuid] = at
        recent.append(_Seen(at, code, origin))
        return at

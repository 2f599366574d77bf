"""One XID, one event: reconciles the places an XID is seen and keeps event times unique.

The same XID can reach the collector twice: from the GPU source (NVML's
event set, dcgm-exporter's counts) and from the kernel log. Each origin sees
every XID, so an occurrence matches at most one of another origin's with the
same GPU and code within `window_s`; a match is the same XID and no new
occurrence. Two XIDs of one code from one origin are two, however close.

Each (GPU, code, origin) keeps its unmatched occurrences of the last `window_s`
in time order, so a flood of one XID costs constant time a line, not a scan.

`gpu_events` is keyed by (GPU, time, kind), so each XID event of a GPU gets
a time strictly after the previous one (+1 ms where two fall in the same
millisecond, the contract's resolution): `stamp`.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta

_TICK = timedelta(milliseconds=1)


class XidLedger:
    def __init__(self, *, window_s: float = 30.0, keep: int = 1_000_000) -> None:
        self.window = timedelta(seconds=window_s)
        self.keep = keep  # unmatched occurrences held per (GPU, code, origin), at most
        self._unmatched: dict[tuple[str, int], dict[str, deque[datetime]]] = {}
        self._last: dict[str, datetime] = {}

    def admit(self, gpu_uuid: str, code: int, origin: str, at: datetime) -> bool:
        """True for a new occurrence; False when another origin already reported this one."""
        by_origin = self._unmatched.setdefault((gpu_uuid, code), {})
        for other, seen in by_origin.items():
            if other == origin:
                continue
            while seen and seen[0] < at - self.window:
                seen.popleft()  # too old to be this one, or any later one
            if seen and abs(seen[0] - at) <= self.window:
                seen.popleft()
                return False
        mine = by_origin.setdefault(origin, deque(maxlen=self.keep))
        while mine and mine[0] < at - self.window:
            mine.popleft()
        mine.append(at)
        return True

    def stamp(self, gpu_uuid: str, at: datetime) -> datetime:
        """`at` to the millisecond, after every time this GPU's XID events had before."""
        at = at.replace(microsecond=at.microsecond // 1000 * 1000)
        last = self._last.get(gpu_uuid)
        if last is not None and at <= last:
            at = last + _TICK
        self._last[gpu_uuid] = at
        return at

"""One XID, one event: reconciles the places an XID is seen and keeps event times unique.

The same XID can reach the collector from several origins: the GPU source
(NVML's event set, dcgm-exporter's per-code counts or its last-XID gauge), the
kernel log's XID line, and the driver's fell-off-the-bus line that names no XID.
Each occurrence is kept with the origins that have reported it. A report from
an origin matches the oldest occurrence of the same GPU and code that this origin
has not reported yet and whose time can be the report's: it is that occurrence,
not a new one, however many origins report it and in whatever order. Two reports
of one code from one origin are two occurrences, however close.

When an occurrence happened is known to within an interval: a kernel log line
has its own time; a GPU source reports what happened since its previous read of
that GPU (`since`, up to `at`). Two reports can be one occurrence when their
intervals meet within `window_s` (clocks and log delivery differ by seconds), so
a poll period of any length pairs the gauge's XID with the kernel's line.

Occurrences are kept for `horizon_s` (a GPU back after a long loss reports what
happened while it was gone) and at most `keep` per GPU and code. Each origin's
reports come in time order, so a cursor per (GPU, code, origin) skips what that
origin has reported or can no longer match: a flood of one XID from one origin
costs constant time a line, not a scan.

`gpu_events` is keyed by (GPU, time, kind), so each XID event of a GPU gets
a time strictly after the previous one (+1 ms where two fall in the same
millisecond, the contract's resolution): `stamp`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

_TICK = timedelta(milliseconds=1)


@dataclass(slots=True)
class _Occurrence:
    seq: int
    lo: datetime  # it happened at or after this
    hi: datetime  # and at or before this
    origins: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Code:
    occurrences: deque[_Occurrence]
    cursors: dict[str, int] = field(default_factory=dict)  # origin -> first seq it may still match
    next_seq: int = 0


class XidLedger:
    def __init__(self, *, window_s: float = 30.0, horizon_s: float = 3600.0, keep: int = 100_000) -> None:
        self.window = timedelta(seconds=window_s)
        self.horizon = timedelta(seconds=max(horizon_s, window_s))
        self.keep = keep  # occurrences held per (GPU, code), at most
        self._codes: dict[tuple[str, int], _Code] = {}
        self._last: dict[str, datetime] = {}

    def admit(
        self, gpu_uuid: str, code: int, origin: str, at: datetime, since: datetime | None = None
    ) -> bool:
        """True for a new occurrence; False when another origin already reported this one. `since`: the
        report covers (since, at], a GPU source's time since its previous read (None: exactly `at`)."""
        lo = at if since is None else min(max(since, at - self.horizon), at)
        entry = self._codes.get((gpu_uuid, code))
        if entry is None:
            entry = self._codes[(gpu_uuid, code)] = _Code(deque(maxlen=self.keep))
        found = entry.occurrences
        while found and found[0].hi < at - self.horizon:
            found.popleft()
        cursor = entry.cursors.get(origin, 0)
        if found and cursor < entry.next_seq:  # else everything held is this origin's already (a flood)
            first = found[0].seq
            cursor = max(cursor, first)
            done = True  # every occurrence before the one looked at is settled for this origin
            for occurrence in _from(found, cursor - first):
                settled = origin in occurrence.origins or occurrence.hi < lo - self.window
                if done and settled:
                    cursor = occurrence.seq + 1
                    continue
                done = False
                if settled or occurrence.lo > at + self.window:
                    continue
                occurrence.origins.add(origin)
                entry.cursors[origin] = cursor
                return False
            entry.cursors[origin] = cursor
        found.append(_Occurrence(entry.next_seq, lo, at, {origin}))
        entry.next_seq += 1
        if cursor == entry.next_seq - 1:  # all before it settled for this origin, and it is its own
            entry.cursors[origin] = entry.next_seq
        return True

    def stamp(self, gpu_uuid: str, at: datetime) -> datetime:
        """`at` to the millisecond, after every time this GPU's XID events had before."""
        at = at.replace(microsecond=at.microsecond // 1000 * 1000)
        last = self._last.get(gpu_uuid)
        if last is not None and at <= last:
            at = last + _TICK
        self._last[gpu_uuid] = at
        return at


def _from(items: deque[_Occurrence], start: int) -> Iterator[_Occurrence]:
    """The occurrences from index `start` on (a cursor is near the end, where a deque indexes cheaply)."""
    for i in range(start, len(items)):
        yield items[i]

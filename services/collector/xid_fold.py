"""Floods cost what they are worth: repeats of one XID on one GPU within a window are one event.

A GPU can log the same XID hundreds of thousands of times (one node of an
operator's fleet wrote 800,000 lines of XID 95). Each line an event would be that
many messages, rows and judgements. Here the first line of a (GPU, XID) opens a
fold and is published at once, as any XID is: a new XID, or an XID on another GPU,
never waits behind a flood. Every repeat whose time falls within `window_s` of
that first line joins the fold. When the window has passed (checked every poll,
and for every fold at shutdown), a fold that took repeats is published again: the
same event (GPU, time, kind) with `count`, the exact number of lines, and `last`,
the newest line's time. The sink keeps the revision with the higher count, so the
flood is one row. A repeat after the window opens the next fold.

Nothing here drops a line: each one is counted in exactly one fold, and every fold
is published by the first poll after its window (or when the collector stops).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuhealth.contract.wire_time import wire_time
from shared.contract.models import GpuEvent

MAX_OPEN = 100_000  # open folds (GPU x code); beyond it the one whose window ends first is closed early


@dataclass(slots=True)
class _Fold:
    event: GpuEvent  # the first line's event, as published
    closes: datetime  # lines before this join the fold
    last: datetime
    count: int = 1


class XidFolder:
    def __init__(self, *, window_s: float, max_open: int = MAX_OPEN) -> None:
        if not window_s > 0:
            raise ValueError("the fold window must be above 0 seconds")
        self.window = timedelta(seconds=window_s)
        self.max_open = max_open
        self._open: dict[tuple[str, int], _Fold] = {}

    def add(self, gpu_uuid: str, code: int, at: datetime, first: Callable[[], GpuEvent]) -> list[GpuEvent]:
        """One line of XID `code` on the GPU at `at`; what to publish now (`first()` builds the event of
        a line that opens a fold)."""
        key = (gpu_uuid, code)
        fold = self._open.get(key)
        if fold is not None and at < fold.closes:
            fold.count += 1
            fold.last = max(fold.last, at)
            return []
        out = [] if fold is None else self._close(key)
        if len(self._open) >= self.max_open:
            out += self._close(min(self._open, key=lambda k: self._open[k].closes))
        event = first()
        self._open[key] = _Fold(event, at + self.window, at)
        return [*out, event]

    def due(self, now: datetime) -> list[GpuEvent]:
        """The folds whose window ended by `now`, closed: a revision of each that took repeats."""
        out: list[GpuEvent] = []
        for key in [k for k, fold in self._open.items() if fold.closes <= now]:
            out += self._close(key)
        return out

    def close_all(self) -> list[GpuEvent]:
        """Every fold closed (the collector is stopping)."""
        out: list[GpuEvent] = []
        for key in list(self._open):
            out += self._close(key)
        return out

    @property
    def open_folds(self) -> int:
        return len(self._open)

    def _close(self, key: tuple[str, int]) -> list[GpuEvent]:
        fold = self._open.pop(key)
        if fold.count == 1:
            return []  # published whole already
        first = fold.event
        last = max(fold.last.replace(microsecond=fold.last.microsecond // 1000 * 1000), first.time)
        details = {**first.details, "count": fold.count, "last": wire_time(last)}
        return [first.model_copy(update={"details": details})]

"""sparkline(): a series of numbers as one line of block characters, for logs and terminals."""

from __future__ import annotations

import math
from collections.abc import Iterable

BLOCKS = "▁▂▃▄▅▆▇█"
MISSING = " "


def _finite(value: object) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def sparkline(
    values: Iterable[float | int | None],
    *,
    width: int | None = None,
    lo: float | None = None,
    hi: float | None = None,
) -> str:
    """One character per value, low to high over `lo`..`hi` (default: the series' own range).

    Missing, NaN and infinite values are blanks. `width` keeps the most recent
    values only. Values outside a fixed `lo`..`hi` are clamped to its ends, and
    a flat series is drawn at the bottom.
    """
    if width is not None and width < 0:
        raise ValueError("width must be >= 0")
    series = [_finite(v) for v in values]
    if width is not None:
        series = series[max(0, len(series) - width) :] if width else []
    known = [v for v in series if v is not None]
    if not known:
        return MISSING * len(series)
    low = _finite(lo) if lo is not None else min(known)
    high = _finite(hi) if hi is not None else max(known)
    if low is None or high is None:
        raise ValueError("lo and hi must be finite numbers")
    if high < low:
        raise ValueError("hi must not be below lo")
    # Two huge values of opposite sign span more than a float holds: then both sides are halved
    # (halving always, instead, would round a span of the tiniest numbers down to nothing).
    span = high - low
    halved = math.isinf(span)
    if halved:
        span = high / 2 - low / 2
    top = len(BLOCKS) - 1
    out = []
    for v in series:
        if v is None:
            out.append(MISSING)
        elif span == 0:
            out.append(BLOCKS[0])
        else:
            clamped = min(max(v, low), high)
            offset = clamped / 2 - low / 2 if halved else clamped - low
            out.append(BLOCKS[min(top, int(offset / span * top + 0.5))])
    return "".join(out)

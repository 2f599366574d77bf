"""Usage: GPU-hours by job, pod, namespace, user, class or placement, busy and idle shares, energy; as files.

The database computes every figure (shared.store.usage) from the 1-minute usage
rollups, so a window is whole minutes: `from` and `to` are taken down to the
minute. A GPU that stopped reporting for longer than the scorer's
`missing_after_s` (at least a minute) counts nothing for that time. The export
answers the same rows as /usage (or /usage/timeline with `step`), as CSV or
Parquet.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response

from shared.store import usage

from ..answers.usage import Usage, UsageTimeline
from ..deps import Db, State
from ..export import MEDIA_TYPES, exported
from ..parameters import BUCKET_SECONDS, UsageExportQuery, UsageQuery, UsageTimelineQuery

router = APIRouter(tags=["usage"])
WEEK = timedelta(days=7)


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def question(query: UsageQuery, state: State, step: str | None = None) -> usage.UsageQuery:
    """The store's question for `query`: its window in whole minutes, its filters, the scorer's gap."""
    start, end = query.span(default=WEEK, max_days=state.settings.max_range_days)
    start, end = _minute(start), _minute(end)
    if start >= end:
        raise HTTPException(400, "the window holds no whole minute: usage is counted by the minute")
    return usage.UsageQuery(
        start=start, end=end, by=query.by, filters=query.filters(),
        step=timedelta(seconds=BUCKET_SECONDS[step]) if step else None,  # type: ignore[index]
        max_gap=timedelta(seconds=max(60.0, state.missing_after_s)),
    )  # fmt: skip


def window_answer(q: usage.UsageQuery, found: usage.Usage) -> Usage:
    (total,) = found.totals
    return Usage.model_validate(
        {"from": q.start, "to": q.end, "by": q.by, "groups": found.groups, "total": total}
    )


def timeline_answer(q: usage.UsageQuery, step: str, found: usage.Usage) -> UsageTimeline:
    groups: dict[datetime, list[dict[str, Any]]] = defaultdict(list)
    for g in found.groups:
        groups[g["period"]].append(g)
    periods = [{"period": t["period"], "total": t, "groups": groups[t["period"]]} for t in found.totals]
    return UsageTimeline.model_validate(
        {"from": q.start, "to": q.end, "by": q.by, "step": step, "periods": periods}
    )


@router.get("/usage")
async def usage_by(db: Db, state: State, query: Annotated[UsageQuery, Query()]) -> Usage:
    """GPU-hours, busy and idle-while-allocated shares, utilisation and energy by `by`, and their total.

    Filters on any dimension narrow what is counted; the total is of what they keep. Default
    window: the last 7 days."""
    q = question(query, state)
    async with db.reading() as conn:
        found = await usage.usage(conn, q)
    return window_answer(q, found)


@router.get("/usage/timeline")
async def usage_timeline(
    db: Db, state: State, query: Annotated[UsageTimelineQuery, Query()]
) -> UsageTimeline:
    """The same figures per hour, six hours or day (UTC-aligned): each period's groups and total."""
    q = question(query, state, query.step)
    async with db.reading() as conn:
        found = await usage.usage(conn, q)
    return timeline_answer(q, query.step, found)


BINARY = {"schema": {"type": "string", "format": "binary"}}
ROWS = "one row per group and per total: the figures of /usage (or /usage/timeline)"
FILE = {200: {"content": {media: BINARY for media in MEDIA_TYPES.values()}, "description": ROWS}}


@router.get("/usage/export", response_class=Response, responses=FILE)  # type: ignore[arg-type]
async def usage_export(db: Db, state: State, query: Annotated[UsageExportQuery, Query()]) -> Response:
    """/usage (or, with `step`, /usage/timeline) as a CSV or Parquet file: the same rows, the same numbers."""
    q = question(query, state, query.step)
    async with db.reading() as conn:
        found = await usage.usage(conn, q)
    answer = timeline_answer(q, query.step, found) if query.step else window_answer(q, found)
    name = f"gpu-usage-by-{q.by}-{q.start:%Y%m%dT%H%M}-{q.end:%Y%m%dT%H%M}.{query.format}"
    return Response(
        exported(answer, query.format),
        media_type=MEDIA_TYPES[query.format],
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )

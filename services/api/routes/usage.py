"""Usage: GPU-hours by job, pod, namespace, user, class or placement, busy and idle shares, energy; as files;
one GPU's timeline: what ran on it, its verdicts, alerts and events; LLM serving per model, server and period.

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

from shared.store import gpu_timeline, usage, workload

from ..answers.usage import GpuTimeline, LlmTimeline, Usage, UsageTimeline
from ..deps import Db, Settings, State
from ..export import MEDIA_TYPES, exported
from ..parameters import (
    BUCKET_SECONDS,
    GpuPath,
    GpuTimelineQuery,
    LlmTimelineQuery,
    UsageExportQuery,
    UsageQuery,
    UsageTimelineQuery,
)

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
        start=start,
        end=end,
        by=query.by,
        filters=query.filters(),
        step=timedelta(seconds=BUCKET_SECONDS[step]) if step else None,  # type: ignore[index]
        max_gap=timedelta(seconds=max(60.0, state.missing_after_s)),
    )


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


@router.get("/gpus/{gpu_uuid}/timeline")
async def gpu_timeline_of(
    db: Db, limits: Settings, gpu_uuid: GpuPath, query: Annotated[GpuTimelineQuery, Query()]
) -> GpuTimeline:
    """What was on one GPU over a range and what was said of it: the jobs (labels) and the process
    classes and users it had, each process listed, the verdicts in force and their changes, the alerts
    open at any moment of it, its events. "What was on this GPU when it failed" in one answer; an
    unknown GPU has empty lists. Default range: the last 24 hours."""
    start, end = query.span(default=timedelta(hours=24), max_days=limits.max_range_days)
    async with db.reading() as conn:
        found = await gpu_timeline.gpu_timeline(conn, gpu_uuid, start=start, end=end, limit=query.limit)
    truncated = [name for name, rows in found.items() if len(rows) > query.limit]
    lists = {name: rows[: query.limit] for name, rows in found.items()}
    return GpuTimeline.model_validate(
        {"gpu_uuid": gpu_uuid, "from": start, "to": end, **lists, "truncated": truncated}
    )


@router.get("/llm/timeline")
async def llm_timeline(db: Db, limits: Settings, query: Annotated[LlmTimelineQuery, Query()]) -> LlmTimeline:
    """LLM serving per model and server by hour or day (UTC): requests, errors, tokens in and out,
    TTFT and TPOT p50/p95/p99, tokens/s p50 and p5, from the sessions the monitor recorded."""
    start, end = query.span(default=WEEK, max_days=limits.max_range_days)
    step = timedelta(seconds=BUCKET_SECONDS[query.step])
    async with db.reading() as conn:
        periods = await workload.llm_timeline(conn, start, end, step, model=query.model, server=query.server)
    return LlmTimeline.model_validate({"from": start, "to": end, "step": query.step, "periods": periods})

"""The past: a GPU's readings over time and its verdict changes, the fleet's events."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from shared.store import health, history
from shared.store.history import EventFilters

from ..answers.history import Events, Series, VerdictHistory
from ..deps import Db, Settings
from ..paging import decode_cursor, page
from ..parameters import BUCKET_SECONDS, Bucket, EventsQuery, GpuPath, PageQuery, SeriesQuery

router = APIRouter(tags=["history"])


def fit_bucket(bucket: Bucket, start: datetime, end: datetime, max_points: int) -> tuple[Bucket, datetime]:
    """The finest bucket, no finer than `bucket`, that covers start..end in at most `max_points` points."""
    span = (end - start).total_seconds()
    for name, seconds in BUCKET_SECONDS.items():
        if seconds >= BUCKET_SECONDS[bucket] and span / seconds <= max_points:
            return name, start
    widest = max(BUCKET_SECONDS, key=BUCKET_SECONDS.__getitem__)
    return widest, end - timedelta(seconds=BUCKET_SECONDS[widest] * max_points)


@router.get("/gpus/{gpu_uuid}/series")
async def gpu_series(
    db: Db, limits: Settings, gpu_uuid: GpuPath, query: Annotated[SeriesQuery, Query()]
) -> Series:
    """Temperature, power, utilisation, memory and ECC over time; 1 minute and up from the rollup.

    A bucket too fine for the range is widened to the finest that keeps the answer within
    `max_points` (`bucket` says which was used, `requested_bucket` what was asked); if even
    a day is too fine, the range is shortened to its newest end (`from` says where it starts).
    """
    start, end = query.span(default=timedelta(hours=24), max_days=limits.max_range_days)
    bucket, start = fit_bucket(query.bucket, start, end, limits.max_points)
    async with db.reading() as conn:
        points = await history.series(conn, gpu_uuid, start=start, end=end, bucket_s=BUCKET_SECONDS[bucket])
    return Series.model_validate(
        {
            "gpu_uuid": gpu_uuid,
            "from": start,
            "to": end,
            "bucket": bucket,
            "requested_bucket": query.bucket,
            "points": points,
        }
    )


@router.get("/gpus/{gpu_uuid}/history")
async def gpu_history(db: Db, gpu_uuid: GpuPath, query: Annotated[PageQuery, Query()]) -> VerdictHistory:
    """Verdict changes of one GPU (gpu_health), newest first; an unknown GPU has an empty history."""
    after = tuple(decode_cursor(query.cursor, [datetime, str])) if query.cursor else None
    async with db.reading() as conn:
        found, total = await health.verdict_history(conn, gpu_uuid, limit=query.limit + 1, after=after)
    listed = page("history", found, total=total, limit=query.limit, key=lambda r: (r["time"], r["subsystem"]))
    return VerdictHistory.model_validate({"gpu_uuid": gpu_uuid, **listed})


@router.get("/events")
async def events(db: Db, limits: Settings, query: Annotated[EventsQuery, Query()]) -> Events:
    """GPU events (XIDs, double-bit errors, throttling, lost GPUs...), newest first."""
    start, end = query.span(default=timedelta(days=7), max_days=limits.max_range_days)
    after = tuple(decode_cursor(query.cursor, [datetime, str, str])) if query.cursor else None
    filters = EventFilters(start=start, end=end, gpu=query.gpu, kind=query.kind)
    async with db.reading() as conn:
        found, total = await history.events(conn, filters, limit=query.limit + 1, after=after)
    listed = page(
        "events", found, total=total, limit=query.limit, key=lambda r: (r["time"], r["gpu_uuid"], r["kind"])
    )
    return Events.model_validate(listed)

"""GPU-hours by job, pod, namespace, user, workload class or placement: computed by the database.

The sums come from the 1-minute usage rollups (schema/0050) through one function,
usage_facts (schema/0052), that the Grafana panels call as well: gpu_usage_1min
(per GPU, minute and labels: samples, their first and last time, busy and idle
samples, the energy counter's first, last and largest value) and gpu_work_1min
(the process polls' shares of each GPU-minute by class and user).

How time is counted. A GPU's minutes are joined into runs of reporting: a run
ends where the next sample came more than `max_gap` after the last one (the
scorer's `missing_after_s`, at least a minute), or where the GPU reports from
another host (it moved). A run counts from its first sample to its last, plus
one interval after the last (the last minute's mean interval; a run of one
sample, `single_sample_s`); a minute of it counts from the previous minute's
last sample to its own last one, shared out among its samples. The time a GPU
did not report counts as nothing: not busy, not idle, not allocated. A gap
shorter than `max_gap` is bridged: with `max_gap` of a minute or more the runs
found in the rollup are the runs found in the raw samples.

What the time is split into. A sample is busy at 1 % utilisation or more, idle
below (the scorer's [idle] threshold); a sample without utilisation is
neither. Time is allocated when the GPU carried a job, pod or namespace label
or a process ran on it; idle-while-allocated is idle time that was allocated.
A GPU-minute's time goes to its process classes and users by their shares of
the minute's polls; a minute without a process listing is class `unknown`, a
listing with no process class `none`. Labels and classes meet by the minute:
in a minute where both changed, each label's time takes the minute's class
shares.

Energy is the energy counter's increase, never power x time: within a minute
from its first, last and largest value (a counter that went down was reset:
the increase is up to its largest value, then from zero to its last), between
minutes of a run from the last value to the next first one (a decrease is a
reset: the new value counts, capped at what 2 kW could draw in the gap). Energy
across a gap between runs is nobody's: no sample says who used it. A GPU
without the counter adds no energy.

Rows are dicts: the dimension's `key`, `gpus`, `gpu_hours`, `busy_hours`,
`busy_share`, `idle_allocated_hours`, `idle_allocated_share`, `avg_util_pct`,
`energy_kwh` (and `period` for a timeline); the total is the same row for
every group the filters keep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from .results import Row, dict_rows, dict_rows_async

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]

# What usage can be grouped and filtered by (the answer's name -> the facts' column).
DIMENSIONS: dict[str, str] = {
    "gpu": "gpu_uuid",
    "hostname": "hostname",
    "cluster": "cluster",
    "namespace": "namespace",
    "job": "job",
    "pod": "pod",
    "user": "username",
    "class": "classification",
}
# Dimensions stored in gpu_usage_1min: a filter on them first narrows the GPUs read.
_LABELS = ("gpu", "hostname", "cluster", "namespace", "job", "pod")
CLASSES = ("training", "inference", "llm_serving", "gaming", "compute", "none", "unknown")


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """A usage question: the window [start, end) (whole minutes), how to group, what to keep."""

    start: datetime
    end: datetime
    by: str = "namespace"
    filters: Mapping[str, str] = field(default_factory=dict)
    step: timedelta | None = None  # a timeline: one group per `step` (UTC-aligned) and key
    max_gap: timedelta = timedelta(seconds=60)
    single_sample_s: float = 10.0  # a run of one sample: the collectors' default poll

    def __post_init__(self) -> None:
        if self.by not in DIMENSIONS:
            raise ValueError(f"usage is grouped by one of {sorted(DIMENSIONS)}, not {self.by!r}")
        if unknown := sorted(set(self.filters) - set(DIMENSIONS)):
            raise ValueError(f"usage is filtered by {sorted(DIMENSIONS)}, not {unknown}")
        if self.max_gap < timedelta(minutes=1):
            raise ValueError("max_gap under a minute would find gaps the minute rollup cannot see")
        if self.start >= self.end:
            raise ValueError("the window's start must be before its end")
        if self.step is not None and self.step < timedelta(minutes=1):
            raise ValueError("a timeline's step is a minute or more")


# The facts (schema/0052's usage_facts: one row per GPU, host, minute, label set and (class, user), with
# the seconds a sample stands for, busy, idle and utilisation, energy). {gpus}: the GPUs to read, NULL all.
_FACTS = "WITH facts AS (SELECT * FROM usage_facts(%(start)s, %(end)s, %(gap)s, %(single)s, {gpus}))"

_FIGURES = """
       count(DISTINCT gpu_uuid) AS gpus,
       coalesce(sum(n * s), 0) / 3600 AS gpu_hours,
       coalesce(sum(busy_n * s), 0) / 3600 AS busy_hours,
       sum(busy_n * s) / nullif(sum(n * s), 0) AS busy_share,
       coalesce(sum(idle_n * s) FILTER (WHERE allocated), 0) / 3600 AS idle_allocated_hours,
       coalesce(sum(idle_n * s) FILTER (WHERE allocated), 0) / nullif(sum(n * s), 0) AS idle_allocated_share,
       sum(util_sum * s) / nullif(sum((busy_n + idle_n) * s), 0) AS avg_util_pct,
       sum(energy_mj) / 3.6e9 AS energy_kwh"""


def _statement(q: UsageQuery) -> tuple[sql.Composed, dict[str, Any]]:
    params: dict[str, Any] = {
        "start": q.start,
        "end": q.end,
        "gap": q.max_gap,
        "single": q.single_sample_s,
        "step": q.step,
    }
    label_filters = [
        sql.SQL("{} = {}").format(sql.Identifier(DIMENSIONS[d]), sql.Placeholder(f"f_{d}"))
        for d in sorted(q.filters)
        if d in _LABELS
    ]
    gpus: sql.Composable = sql.SQL("NULL")
    if label_filters:
        gpus = sql.SQL(
            "(SELECT coalesce(array_agg(DISTINCT gpu_uuid), '{{}}') FROM gpu_usage_1min"
            " WHERE bucket >= %(start)s AND bucket < %(end)s AND {})"
        ).format(sql.SQL(" AND ").join(label_filters))
    where = [
        sql.SQL("{} = {}").format(sql.Identifier(DIMENSIONS[d]), sql.Placeholder(f"f_{d}"))
        for d in sorted(q.filters)
    ]
    params.update({f"f_{d}": v for d, v in q.filters.items()})
    key = sql.Identifier(DIMENSIONS[q.by])
    if q.step is None:
        head, sets, order = sql.SQL(""), sql.SQL("({}), ()").format(key), sql.SQL("")
    else:
        head = sql.SQL("public.time_bucket(%(step)s::interval, bucket) AS period, ")
        sets = sql.SQL("(period, {}), (period), ()").format(key)
        order = sql.SQL("period NULLS LAST, ")
    statement = sql.SQL(
        "{facts} SELECT {head}{key} AS key, GROUPING({key}) = 1 AS is_total, {figures}"
        " FROM facts {where} GROUP BY GROUPING SETS ({sets})"
        " ORDER BY {order}is_total, gpu_hours DESC NULLS LAST, key"
    ).format(
        facts=sql.SQL(_FACTS).format(gpus=gpus),
        head=head,
        key=key,
        figures=sql.SQL(_FIGURES),
        sets=sets,
        order=order,
        where=sql.SQL("WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    return statement, params


@dataclass(frozen=True, slots=True)
class Usage:
    """A usage answer's rows: `groups` by key (and period); `totals`, one per period (one without a step)."""

    groups: list[Row]
    totals: list[Row]


def _split(rows: list[Row], timeline: bool) -> Usage:
    found = Usage(groups=[], totals=[])
    for r in rows:
        if not r.pop("is_total"):
            found.groups.append(r)
        elif not timeline or r["period"] is not None:  # a timeline's grand total is not a period
            r.pop("key")
            found.totals.append(r)
    return found


async def usage(conn: AsyncConn, q: UsageQuery) -> Usage:
    """GPU-hours, busy and idle-while-allocated shares, utilisation and energy by `q.by`, with totals."""
    return _split(await dict_rows_async(conn, *_statement(q)), q.step is not None)


def usage_sync(conn: SyncConn, q: UsageQuery) -> Usage:
    """`usage` on a sync connection (tests, benches)."""
    return _split(dict_rows(conn, *_statement(q)), q.step is not None)

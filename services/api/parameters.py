"""What a request may say: path values, and one query model per endpoint that refuses names it does not take.

Each endpoint reads its query string into one of the models below
(`Annotated[Model, Query()]`). A model holds every name the endpoint takes, with
its bounds; a name it does not take is a 422 naming it and the names it would
take, so a typo in a filter never silently answers for the whole fleet. Values
are validated here and bound as parameters by `shared.store`, never spliced into
SQL. What a model cannot check alone (a range against the configured maximum, a
cursor against the endpoint's sort key) is a 400 from the handler.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import HTTPException, Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from shared.contract.models import GPU_UUID_PATTERN, EventKind
from shared.contract.models_health import ALERT_STATES, AlertSeverity, HealthState
from shared.contract.models_lifecycle import DECISIONS
from shared.contract.models_verify import Outcome, RecordKind
from shared.store.fleet import SORTS
from shared.store.usage import CLASSES, DIMENSIONS

LABEL = r"^[A-Za-z0-9._:/@+-]{1,253}$"  # hostnames, clusters, racks, who acknowledged

GpuPath = Annotated[str, Path(pattern=GPU_UUID_PATTERN)]
HostPath = Annotated[str, Path(pattern=LABEL, max_length=253)]

Label = Annotated[str | None, Field(pattern=LABEL, max_length=253)]
GpuUuid = Annotated[str | None, Field(pattern=GPU_UUID_PATTERN)]
Cursor = Annotated[
    str | None,
    Field(
        max_length=512,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the `next_cursor` of the previous page; omit for the first",
    ),
]
ISO_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}")  # a date first (a date alone is its midnight, UTC)


def _date_time_only(value: Any) -> Any:
    """A time as the schema says (RFC 3339 text): pydantic would also take a number such as `0.5` as
    a Unix time, which the schema does not allow."""
    if isinstance(value, str) and not ISO_DATE_TIME.match(value):
        raise ValueError("a date-time such as 2026-05-01T12:00:00Z is expected")
    return value


From = Annotated[
    datetime | None,
    BeforeValidator(_date_time_only),
    Field(alias="from", description="default: `to` less the endpoint's window"),
]
To = Annotated[
    datetime | None, BeforeValidator(_date_time_only), Field(alias="to", description="default: now")
]

Bucket = Literal["10s", "1m", "5m", "15m", "1h", "6h", "1d"]
BUCKET_SECONDS: dict[Bucket, int] = {
    "10s": 10,
    "1m": 60,
    "5m": 300,
    "15m": 900,
    "1h": 3600,
    "6h": 21600,
    "1d": 86400,
}


class QueryModel(BaseModel):
    """One endpoint's query parameters; a name that is none of its fields (or their aliases) is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def query_names(cls) -> list[str]:
        """The names this endpoint takes (a field's alias where it has one: `from`, `to`)."""
        return sorted(field.alias or name for name, field in cls.model_fields.items())

    @model_validator(mode="before")
    @classmethod
    def _known_names_only(cls, data: Any) -> Any:
        # extra="forbid" alone says "Extra inputs are not permitted" once per name; this names what is taken.
        if isinstance(data, dict) and (unknown := sorted(set(data) - set(cls.query_names()))):
            takes = f"takes {cls.query_names()}" if cls.model_fields else "takes no query parameters"
            raise PydanticCustomError(
                "unknown_query_parameter",
                "unknown query parameters {unknown}; this endpoint {takes}",
                {"unknown": unknown, "takes": takes},
            )
        return data


class NoQuery(QueryModel):
    """An endpoint that takes no query parameters."""


Limit = Annotated[int, Field(ge=1, le=1000, description="at most this many items")]


class PageQuery(QueryModel):
    """One page of a list: at most `limit` items, after the `cursor` the previous page returned."""

    limit: Limit = 100
    cursor: Cursor = None


class WindowQuery(QueryModel):
    """A window of time, `from`..`to`."""

    start: From = None
    end: To = None

    def span(self, *, default: timedelta, max_days: int) -> tuple[datetime, datetime]:
        """The window in UTC, `default` long where not given: see time_range."""
        return time_range(self.start, self.end, default=default, max_days=max_days)


class GpuListQuery(PageQuery):
    cluster: Label = None
    datacenter: Label = None
    rack: Label = None
    host: Label = None
    model: Annotated[str | None, Field(max_length=128, pattern=r"^[A-Za-z0-9 ._-]+$")] = None
    state: HealthState | None = None
    sort: Literal[tuple(SORTS)] = "score"  # type: ignore[valid-type]
    offset: Annotated[int, Field(ge=0, le=1_000_000, description="prefer `cursor`; kept for old clients")] = 0


class SeriesQuery(WindowQuery):
    bucket: Bucket = "1m"


class EventsQuery(WindowQuery, PageQuery):
    gpu: GpuUuid = None
    kind: Literal[tuple(k.value for k in EventKind)] | None = None  # type: ignore[valid-type]


class AlertsQuery(PageQuery):
    state: Literal[(*ALERT_STATES, "unresolved")] = "unresolved"  # type: ignore[valid-type]
    severity: AlertSeverity | None = None
    gpu: GpuUuid = None
    host: Label = None


class PredictionsQuery(PageQuery):
    limit: Limit = 50
    min_p30: Annotated[float, Field(ge=0, le=1)] = 0.0


class VerificationsQuery(PageQuery):
    kind: Literal[tuple(k.value for k in RecordKind)] | None = None  # type: ignore[valid-type]
    outcome: Literal[tuple(o.value for o in Outcome)] | None = None  # type: ignore[valid-type]


class SystemsQuery(PageQuery):
    limit: Annotated[int, Field(ge=1, le=10_000, description="at most this many items")] = 1000


# The remediator's plans as listed, in the plans' own states (pending: held for an operator).
PLAN_STATES: dict[str, tuple[str, ...]] = {
    "pending": ("held",), "running": ("running",), "failed": ("failed",), "escalated": ("escalated",),
    "done": ("done",), "withdrawn": ("withdrawn",), "open": ("held", "running"),
    "all": ("held", "running", "failed", "escalated", "done", "withdrawn"),
}  # fmt: skip


class PlansQuery(PageQuery):
    state: Literal[tuple(PLAN_STATES)] = "open"  # type: ignore[valid-type]
    mode: Literal["live", "dry_run", "both"] = "both"


class FleetProcessesQuery(QueryModel):
    hostname: Label = None


class LifecycleFilters(QueryModel):
    """Which of the newest run's decisions: of one kind, on one host, whose waiting costs at least so much."""

    decision: Literal[DECISIONS] | None = None  # type: ignore[valid-type]
    host: Label = None
    min_waiting: Annotated[
        float, Field(ge=0, le=1e12, description="only GPUs whose waiting costs at least this much per day")
    ] = 0.0


class LifecycleQuery(LifecycleFilters, PageQuery):
    pass


class UsageQuery(WindowQuery):
    """A window (default: the last 7 days), the dimension to group by, and filters on any dimension."""

    by: Literal[tuple(DIMENSIONS)] = "namespace"  # type: ignore[valid-type]
    gpu: GpuUuid = None
    hostname: Label = None
    cluster: Label = None
    namespace: Label = None
    job: Label = None
    pod: Label = None
    user: Label = None
    classification: Annotated[  # type: ignore[valid-type]
        Literal[CLASSES] | None,
        Field(alias="class", description="a process class; `none`: no process, `unknown`: never listed"),
    ] = None

    def filters(self) -> dict[str, str]:
        """The filters given, by dimension name."""
        given = {d: getattr(self, "classification" if d == "class" else d) for d in DIMENSIONS}
        return {d: v for d, v in given.items() if v is not None}


Step = Literal["1h", "6h", "1d"]


class UsageTimelineQuery(UsageQuery):
    step: Step = "1d"


class GpuTimelineQuery(WindowQuery):
    """A range (default: the last 24 hours) and how many rows each list may hold."""

    limit: Annotated[int, Field(ge=1, le=5000, description="at most this many rows in each list")] = 1000


class LlmTimelineQuery(WindowQuery):
    """A window (default: the last 7 days), a step, and one model or server if wanted."""

    step: Literal["1h", "1d"] = "1d"
    model: Label = None
    server: Label = None


class UsageExportQuery(UsageQuery):
    format: Literal["csv", "parquet"] = "csv"
    step: Annotated[Step | None, Field(description="per period, as the timeline; omit for the window")] = None


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def time_range(
    start: datetime | None, end: datetime | None, *, default: timedelta, max_days: int
) -> tuple[datetime, datetime]:
    """`start`..`end` in UTC (a naive time is UTC), `end` now and `start` `default` earlier when not given;
    HTTPException(400) for a reversed range, one longer than `max_days`, or one outside the calendar."""
    try:
        end = _utc(end) if end else datetime.now(UTC)
        start = _utc(start) if start else end - default
    except OverflowError:  # e.g. to=0001-01-01: in UTC, or a default window back, it is before year 1
        raise HTTPException(400, "'from'/'to' lie outside the calendar once in UTC") from None
    if start >= end:
        raise HTTPException(400, "'from' must be before 'to'")
    if end - start > timedelta(days=max_days):
        raise HTTPException(400, f"the range may span at most {max_days} days")
    return start, end

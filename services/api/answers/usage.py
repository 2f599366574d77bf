"""Usage's answers: GPU-hours and their shares by a dimension, with totals, for a window or per period."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from . import Answer, ApiTime

Hours = Annotated[float, Field(ge=0)]
Share = Annotated[float | None, Field(ge=0, le=1, description="of gpu_hours; null when there are none")]


class UsageFigures(Answer):
    """What a group (or all of them) used in the window.

    A GPU's time counts while it reported (a GPU that stopped reporting counts nothing); busy is
    utilisation of 1 % or more, idle-while-allocated is idle time with a job, pod or namespace label
    or a process on the GPU. Energy is the GPU's energy counter's increase (null: no GPU of the
    group reported one)."""

    gpus: int = Field(description="distinct GPUs that contributed")
    gpu_hours: Hours
    busy_hours: Hours
    busy_share: Share
    idle_allocated_hours: Hours
    idle_allocated_share: Share
    avg_util_pct: float | None = Field(description="utilisation averaged over the time it was reported")
    energy_kwh: float | None


class UsageGroup(UsageFigures):
    key: str | None = Field(description="the group's value of `by`; null: samples without that label")


class Usage(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from", description="the window's start, whole minutes")
    end: ApiTime = Field(alias="to", description="the window's end (exclusive), whole minutes")
    by: str
    groups: list[UsageGroup] = Field(description="the most GPU-hours first")
    total: UsageFigures = Field(description="every group the filters keep")


class UsagePeriod(Answer):
    period: ApiTime = Field(description="the period's start (UTC-aligned)")
    total: UsageFigures
    groups: list[UsageGroup]


class UsageTimeline(Answer):
    model_config = ConfigDict(populate_by_name=True)

    start: ApiTime = Field(alias="from")
    end: ApiTime = Field(alias="to")
    by: str
    step: str
    periods: list[UsagePeriod] = Field(description="the periods with any usage, oldest first")

"""The answers about the past: a GPU's series and verdict changes, the fleet's events."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from shared.contract.models_health import HealthState

from ..parameters import Bucket
from . import Answer, ApiTime, NextCursor, StoredObject, Total


class SeriesPoint(Answer):
    """One bucket: averages and maxima of the readings, and the maximum of each counter behind findings."""

    t: ApiTime
    temp_c: float | None
    temp_max_c: float | None
    power_w: float | None
    util_pct: float | None
    fb_used_mib: int | None
    ecc_sbe: int | None
    ecc_dbe: int | None
    retired_pages_sbe: int | None
    retired_pages_dbe: int | None
    retired_pages_pending: int | None
    remapped_rows_uncorrectable: int | None
    row_remap_failure: int | None
    pcie_replay: int | None
    xid_last: int | None
    nvlink_crc_flit_errors: int | None
    nvlink_crc_data_errors: int | None
    nvlink_replay_errors: int | None
    nvlink_recovery_errors: int | None
    power_violation_us: int | None
    thermal_violation_us: int | None


class Series(Answer):
    model_config = ConfigDict(populate_by_name=True)

    gpu_uuid: str
    start: ApiTime = Field(alias="from", description="where the answer starts (later if it was shortened)")
    end: ApiTime = Field(alias="to")
    bucket: Bucket = Field(description="the bucket used: widened from the one asked to fit max_points")
    requested_bucket: Bucket
    points: list[SeriesPoint]


class VerdictChange(Answer):
    time: ApiTime
    subsystem: str
    state: HealthState
    rule: str | None
    evidence: StoredObject


class VerdictHistory(Answer):
    gpu_uuid: str
    history: list[VerdictChange]
    total: Total
    limit: int
    next_cursor: NextCursor


class Event(Answer):
    time: ApiTime
    gpu_uuid: str
    kind: str
    hostname: str
    cluster: str | None
    datacenter: str | None
    rack: str | None
    details: StoredObject = Field(description="the kind's facts (the XID code, the DBE increment...)")


class Events(Answer):
    events: list[Event]
    total: Total
    limit: int
    next_cursor: NextCursor

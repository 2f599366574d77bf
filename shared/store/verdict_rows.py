"""The rows the scorer's input statements return (`verdict_inputs`), in each statement's column order."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple


class InventoryRow(NamedTuple):
    gpu_uuid: str
    hostname: str
    model: str
    last_time: datetime | None  # the latest sample's, or the newest settled rollup minute's end before as_of
    slowdown_c: float
    power_limit_w: float | None
    fb_total_mib: int | None
    pod: str | None
    fb_used_mib: int | None
    row_remap_pending: int | None
    recovery_action: int | None
    driver_version: str | None


class RollupRow(NamedTuple):
    gpu_uuid: str
    dbe_volatile: int | None  # the newest minute's counters of the long window
    retired_pages: int | None
    retired_pending: int | None
    remap_failure: int | None
    remapped_uncorrectable: int | None
    temp_max: float | None  # the short window
    power_avg: float | None
    reasons_any: int | None
    util_max_idle_window: float | None  # the idle window
    idle_minutes: int | None
    sbe_new: int | None  # increments over the long window (a counter reset is not negative)
    pcie_new: int | None
    nvlink_crc_new: int | None
    nvlink_replay_recovery_new: int | None
    dbe_new: int | None
    minutes_long: int
    span_long_s: int | None  # seconds between the first and the newest minute


class XidRow(NamedTuple):
    gpu_uuid: str
    code: int
    recent: int  # within the code's time-to-clear
    total: int  # within the escalation window
    in_repeat_window: int
    times: list[datetime]  # the newest ten, newest first


class XidEventRow(NamedTuple):
    gpu_uuid: str
    code: int
    time: datetime
    source: str
    message: str | None  # the kernel log's text, where the XID was read there


class PatternRow(NamedTuple):
    idx: int  # the pattern's place in the rules file
    gpu_uuid: str
    cancel: bool  # False: one burst of what the pattern counts; True: its newest cancelling signal
    first: datetime
    last: datetime
    lines: int  # the signals in the burst (cancel: how many cancelling signals)


class RemedyRow(NamedTuple):
    """A GPU's newest remedy within the XID window (gpu_remedies): what resolved what came before it."""

    gpu_uuid: str
    at: datetime
    remedy: str  # reset_gpu, reboot_node
    source: str  # remediator, operator, gpu
    plan_id: int | None
    actor: str


class LossRow(NamedTuple):
    gpu_uuid: str
    times: list[datetime]  # gpu_lost events in the escalation window, the newest ten, newest first
    losses: int


class EventStateRow(NamedTuple):
    """What a GPU's events say of its memory since the newest rollup minute the features read."""

    gpu_uuid: str
    dbe_volatile: int | None  # the volatile DBE total the newest ecc_dbe event reported
    remap_failure: bool | None  # a row_remap_failure event
    retired_pending: int | None  # the pages pending retirement the newest event reported


class PrecursorRow(NamedTuple):
    gpu_uuid: str
    first_s: float  # epoch seconds of the trend window's first and newest minute
    last_s: float
    sbe_recent: float  # counter increments in the recent window, and in the rest of the trend window
    sbe_earlier: float
    pcie_recent: float
    pcie_earlier: float
    memory_rows: float  # retired pages (SBE) and correctable remapped rows over the window
    crc_recent: float
    heat_c: float | None  # median temperature above the GPU's own earlier power-to-temperature line
    hw_thermal_fraction: float | None

"""Faults the mock can inject, and what each does to a GPU's readings.

Counter effects are closed-form functions of the time elapsed since the fault
began (e.g. an SBE storm's count grows quadratically), so a counter's value
depends on simulated time only, not on how often the node is scraped, and it
only ever grows. State effects (a power brake, a GPU off the bus) hold while
the fault is active; a fault without a duration lasts until it is cleared.

Faults fall in three groups for the ground truth: precursors (slow signs that
develop over hours to days: SBE growth, page retirement, correctable row
remaps, rising PCIe replays, temperature creeping at constant load), hard
failures (a DBE, a failed remap, a fall off the bus, a critical XID: the
failure itself, at the time a scenario schedules it) and the rest (transients
and healthy conditions such as a sustained heavy workload that runs hot).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, get_args

from shared.plumbing.errors import GpuHealthError

from .profiles import GpuModel


class FaultError(GpuHealthError):
    """A fault request is malformed or cannot apply to the GPU it names."""


class NotFoundError(FaultError):
    """A request names a GPU, node or fault this fleet does not have."""


class RemedyRefusedError(FaultError):
    """A remedy that cannot run on the GPU as it is (a reset of a GPU that has fallen off the bus)."""


class FaultKind(StrEnum):
    SBE_STORM = "sbe_storm"
    DBE = "dbe"
    RETIRED_PAGES = "retired_pages"
    PENDING_RETIREMENT = "pending_retirement"
    ROW_REMAP_FAILURE = "row_remap_failure"
    XID = "xid"
    THERMAL_RUNAWAY = "thermal_runaway"
    POWER_BRAKE = "power_brake"
    PCIE_REPLAY_STORM = "pcie_replay_storm"
    NVLINK_ERRORS = "nvlink_errors"
    FALL_OFF_BUS = "fall_off_bus"
    HANG = "hang"
    REMAPPED_ROWS = "remapped_rows"
    THERMAL_CREEP = "thermal_creep"
    HEAVY_WORKLOAD = "heavy_workload"


# The health subsystem a correct scorer should blame (None: an alert, not a verdict).
SUBSYSTEM: dict[FaultKind, str | None] = {
    FaultKind.SBE_STORM: "memory",
    FaultKind.DBE: "memory",
    FaultKind.RETIRED_PAGES: "memory",
    FaultKind.PENDING_RETIREMENT: "memory",
    FaultKind.ROW_REMAP_FAILURE: "memory",
    FaultKind.XID: "xid",
    FaultKind.THERMAL_RUNAWAY: "thermal",
    FaultKind.POWER_BRAKE: "power",
    FaultKind.PCIE_REPLAY_STORM: "pcie",
    FaultKind.NVLINK_ERRORS: "nvlink",
    FaultKind.FALL_OFF_BUS: "availability",
    FaultKind.HANG: None,
    FaultKind.REMAPPED_ROWS: "memory",
    FaultKind.THERMAL_CREEP: "thermal",
    FaultKind.HEAVY_WORKLOAD: None,  # hot but healthy: a correct scorer blames nothing
}

# Slow signs of a coming failure, and the XIDs that are a failure in themselves.
PRECURSORS = frozenset(
    {
        FaultKind.SBE_STORM,
        FaultKind.RETIRED_PAGES,
        FaultKind.REMAPPED_ROWS,
        FaultKind.PCIE_REPLAY_STORM,
        FaultKind.THERMAL_CREEP,
    }
)
HARD_XIDS = frozenset({48, 61, 62, 64, 74, 79, 95, 119, 120, 140})

# The least remedy that ends a fault (services/mock_dcgm/remedies.py): a GPU reset (a reboot resets every
# GPU of the node, so it ends these too), a reboot of the node, or only a repair. An XID ends on a reset
# unless NVIDIA's immediate action for it is a restart of the machine (79 fallen off the bus: RESTART_BM;
# 151: RESTART_VM). A DBE's row remap is pending until the GPU is reset; a failed remap, and a GPU whose
# memory, cooling, power or links are degrading, stay until a repair.
FixedBy = Literal["reset_gpu", "reboot_node", "repair"]
FIXED_BY: tuple[FixedBy, ...] = get_args(FixedBy)
REBOOT_XIDS = frozenset({79, 151})
_FIXED_BY_KIND: dict[FaultKind, FixedBy] = {
    FaultKind.DBE: "reset_gpu",
    FaultKind.PENDING_RETIREMENT: "reset_gpu",
    FaultKind.HANG: "reset_gpu",
    FaultKind.NVLINK_ERRORS: "reset_gpu",
    FaultKind.FALL_OFF_BUS: "reboot_node",
}


def default_fixed_by(kind: FaultKind, params: dict[str, float]) -> FixedBy:
    """The least remedy that ends a fault of this kind, unless its request says otherwise."""
    if kind is FaultKind.XID:
        return "reboot_node" if int(params["code"]) in REBOOT_XIDS else "reset_gpu"
    return _FIXED_BY_KIND.get(kind, "repair")


# Parameters each kind accepts, with defaults. Anything else is refused.
DEFAULT_PARAMS: dict[FaultKind, dict[str, float]] = {
    FaultKind.SBE_STORM: {"rate_per_hour": 20.0, "growth_per_hour": 4.0},
    FaultKind.REMAPPED_ROWS: {"rows_per_hour": 0.5, "growth_per_hour": 0.05},
    FaultKind.THERMAL_CREEP: {"c_per_hour": 0.4, "max_c": 25.0},
    FaultKind.HEAVY_WORKLOAD: {"level": 1.0, "extra_c": 13.0},  # 2-4 C under slowdown at full load
    FaultKind.DBE: {"count": 1.0},
    FaultKind.RETIRED_PAGES: {"pages_per_hour": 30.0, "growth_per_hour": 0.0},
    FaultKind.PENDING_RETIREMENT: {"pages": 1.0},
    FaultKind.ROW_REMAP_FAILURE: {},
    # lines/over_s: a flood in the kernel log; row: an NVLink XID's decode row (kernel_log.py)
    FaultKind.XID: {"code": 13.0, "lines": 1.0, "over_s": 0.0, "row": 0.0},
    FaultKind.THERMAL_RUNAWAY: {"c_per_minute": 2.0, "max_c": 40.0},
    FaultKind.POWER_BRAKE: {},
    FaultKind.PCIE_REPLAY_STORM: {"replays_per_minute": 100.0, "growth_per_hour": 0.0},
    FaultKind.NVLINK_ERRORS: {"crc_flit_per_minute": 50.0, "replays_per_minute": 5.0},
    FaultKind.FALL_OFF_BUS: {"scrape_delay_s": 1.5},
    FaultKind.HANG: {},
}

_MAX_PARAM = 1e9
_ids = itertools.count(1)


def next_fault_id() -> int:
    """A new fault's id, unique in this process."""
    return next(_ids)


@dataclass(slots=True)
class Fault:
    kind: FaultKind
    node: int
    gpu: int
    start_s: float  # simulated epoch seconds
    duration_s: float | None = None
    params: dict[str, float] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next_fault_id())
    cleared_at_s: float | None = None
    job_crash: int | None = None  # the job crash (services/mock_dcgm/jobs.py) this XID is part of
    fixed_by: FixedBy = "repair"  # the least remedy that ends it (make_fault sets the kind's default)
    # a flaky GPU: after a remedy ends this fault, it comes back recur_after_s later with this probability
    recur_after_s: float | None = None
    recur_probability: float = 0.0
    recurrence_of: int | None = None  # the fault whose remedy this one came back after
    ended_by: str | None = None  # reset_gpu, reboot_node, repair or cleared (None: its duration, or not yet)

    @property
    def end_s(self) -> float | None:
        ends = [e for e in (self.cleared_at_s, self._planned_end()) if e is not None]
        return min(ends) if ends else None

    def _planned_end(self) -> float | None:
        return None if self.duration_s is None else self.start_s + self.duration_s

    def active(self, t: float) -> bool:
        end = self.end_s
        return self.start_s <= t and (end is None or t < end)

    def elapsed(self, t: float) -> float:
        """Seconds of the fault's life up to t (0 before it starts, frozen after it ends)."""
        end = self.end_s
        stop = t if end is None else min(t, end)
        return max(0.0, stop - self.start_s)

    def p(self, name: str) -> float:
        return self.params[name]

    @property
    def hard_failure(self) -> bool:
        """The failure itself (a verdict when it happens), as opposed to a sign of one."""
        if self.kind is FaultKind.XID:
            return int(self.params["code"]) in HARD_XIDS
        return self.kind in (FaultKind.DBE, FaultKind.ROW_REMAP_FAILURE, FaultKind.FALL_OFF_BUS)

    @property
    def precursor(self) -> bool:
        return self.kind in PRECURSORS


def make_fault(
    *,
    kind: str,
    node: int,
    gpu: int,
    start_s: float,
    model: GpuModel,
    duration_s: float | None = None,
    params: dict[str, Any] | None = None,
    fixed_by: Any = None,
    recur_after_s: Any = None,
    recur_probability: Any = None,
) -> Fault:
    """Validate a fault request against its kind and the GPU's model."""
    try:
        fault_kind = FaultKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise FaultError(f"unknown fault kind {kind!r}; known kinds: {known}") from None
    allowed = DEFAULT_PARAMS[fault_kind]
    merged = dict(allowed)
    for name, value in (params or {}).items():
        if name not in allowed:
            raise FaultError(f"{kind} takes no parameter {name!r}; it takes: {', '.join(allowed) or 'none'}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultError(f"parameter {name} must be a number, got {value!r}")
        if not 0 <= value <= _MAX_PARAM:
            raise FaultError(f"parameter {name} must be between 0 and {_MAX_PARAM:g}")
        merged[name] = float(value)
    if duration_s is not None and not 0 < duration_s <= 365 * 86400:
        raise FaultError("duration_s must be between 0 and one year")
    if fault_kind in (FaultKind.RETIRED_PAGES, FaultKind.PENDING_RETIREMENT) and not model.page_retirement:
        raise FaultError(f"{model.name} does not retire pages (it remaps rows); use row_remap_failure")
    if fault_kind in (FaultKind.ROW_REMAP_FAILURE, FaultKind.REMAPPED_ROWS) and not model.row_remapping:
        raise FaultError(f"{model.name} has no row remapping; use retired_pages")
    if fault_kind is FaultKind.XID and not 1 <= merged["code"] <= 999:
        raise FaultError("xid code must be between 1 and 999")
    if fault_kind is FaultKind.HEAVY_WORKLOAD and not 0 < merged["level"] <= 1:
        raise FaultError("heavy_workload level must be above 0 and at most 1")
    if fixed_by is not None and fixed_by not in FIXED_BY:
        raise FaultError(f"fixed_by must be one of {', '.join(FIXED_BY)}")
    after, chance = _recurrence(recur_after_s, recur_probability)
    return Fault(
        kind=fault_kind,
        node=node,
        gpu=gpu,
        start_s=start_s,
        duration_s=duration_s,
        params=merged,
        fixed_by=fixed_by or default_fixed_by(fault_kind, merged),
        recur_after_s=after,
        recur_probability=chance,
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _recurrence(after: Any, chance: Any) -> tuple[float | None, float]:
    """A flaky fault's (recur_after_s, recur_probability), checked: both or neither."""
    if after is None and chance is None:
        return None, 0.0
    if not _number(after) or not 0 < after <= 365 * 86400:
        raise FaultError(
            "recur_after_s must be seconds, above 0 and at most one year (with recur_probability)"
        )
    if not _number(chance) or not 0 <= chance <= 1:
        raise FaultError("recur_probability must be a number from 0 to 1 (with recur_after_s)")
    return float(after), float(chance)


def _growing(rate_per_hour: float, growth_per_hour: float, hours: float) -> float:
    """The integral of rate(h) = r0 * (1 + g*h) over the first `hours`."""
    return rate_per_hour * (hours + growth_per_hour * hours * hours / 2)


def counter_totals(fault: Fault, t: float, model: GpuModel) -> dict[str, float]:
    """What this fault has added to each counter by time t (sample-field names)."""
    e = fault.elapsed(t)
    if t < fault.start_s:
        return {}
    hours, minutes = e / 3600.0, e / 60.0
    match fault.kind:
        case FaultKind.SBE_STORM:
            # The rate itself grows: rate(h) = r0 * (1 + g*h), so the count is its integral.
            sbe = _growing(fault.p("rate_per_hour"), fault.p("growth_per_hour"), hours)
            out = {"ecc_sbe_volatile_total": sbe, "ecc_sbe_aggregate_total": sbe}
            if model.row_remapping:
                out["remapped_rows_correctable"] = float(int(sbe // 200))
            else:
                out["retired_pages_sbe"] = float(int(sbe // 100))
            return out
        case FaultKind.DBE:
            n = fault.p("count")
            out = {"ecc_dbe_volatile_total": n, "ecc_dbe_aggregate_total": n}
            if model.row_remapping:
                out["remapped_rows_uncorrectable"] = n
            else:
                out["retired_pages_dbe"] = n
            return out
        case FaultKind.RETIRED_PAGES:
            return {
                "retired_pages_sbe": _growing(fault.p("pages_per_hour"), fault.p("growth_per_hour"), hours)
            }
        case FaultKind.REMAPPED_ROWS:
            rows = _growing(fault.p("rows_per_hour"), fault.p("growth_per_hour"), hours)
            # Each row is remapped after correctable errors on it: a few SBEs per row.
            return {
                "remapped_rows_correctable": rows,
                "ecc_sbe_volatile_total": rows * 3,
                "ecc_sbe_aggregate_total": rows * 3,
            }
        case FaultKind.PCIE_REPLAY_STORM:
            per_hour = fault.p("replays_per_minute") * 60
            return {"pcie_replay_total": _growing(per_hour, fault.p("growth_per_hour"), hours)}
        case FaultKind.NVLINK_ERRORS:
            flit = fault.p("crc_flit_per_minute") * minutes
            return {
                "nvlink_crc_flit_errors_total": flit,
                "nvlink_crc_data_errors_total": flit / 5,
                "nvlink_replay_errors_total": fault.p("replays_per_minute") * minutes,
                "nvlink_recovery_errors_total": minutes / 10,
            }
        case _:
            return {}


def xid_of(fault: Fault) -> int | None:
    """The XID the driver logs when this fault begins, if any."""
    match fault.kind:
        case FaultKind.XID:
            return int(fault.p("code"))
        case FaultKind.DBE:
            return 48
        case FaultKind.ROW_REMAP_FAILURE:
            return 64
        case FaultKind.FALL_OFF_BUS:
            return 79
        case FaultKind.PENDING_RETIREMENT:
            return 63
        case _:
            return None

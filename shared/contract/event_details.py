"""What a gpu-events message carries in `details`, one closed shape per event kind.

No free-form values: a kind's details are exactly the facts the collector's event
detector (services/collector/events.py) reports for it, typed and bounded, so
nothing the database cannot store (or a reader does not expect) gets through.
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from shared.gpu.dcgm import INT64_BLANK

# ClockEventReason's names, lower case (a unit test keeps the two lists equal).
ThrottleReason = Literal[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
]
Reasons = Annotated[list[ThrottleReason], Field(min_length=1, max_length=16)]
# An ISO 8601 time kept as text in the JSON: producers write it with gpuhealth.contract.wire_time (UTC, `Z`);
# an offset, as older producers wrote it (datetime.isoformat()), is read too.
TimeText = Annotated[
    str,
    Field(
        max_length=40,
        pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$",
    ),
]
# The most lines one folded XID event can count (a fold closes at its window, long before this).
MAX_FOLDED = 2**31 - 1
Increment = Annotated[int, Field(ge=1, lt=INT64_BLANK)]
Total = Annotated[int, Field(ge=0, lt=INT64_BLANK)]
_CLOSED = ConfigDict(extra="forbid", strict=True)


@with_config(_CLOSED)
class XidDetails(TypedDict):
    """An XID; one read from the kernel log also says where and what the kernel wrote.

    A flood of one XID on one GPU travels folded (services/collector/xid_fold.py): `count` lines
    from the event's time to `last`, the kernel message being the first line's. Absent: one line.
    """

    xid: Annotated[int, Field(ge=1, le=100_000)]
    count: NotRequired[Annotated[int, Field(ge=1, le=MAX_FOLDED)]]
    last: NotRequired[TimeText]
    origin: NotRequired[Literal["kmsg", "journal"]]
    # the kernel line named no XID: the driver's line for a GPU that fell off the bus, read as XID 79
    inferred: NotRequired[Literal["fell_off_the_bus"]]
    pci_bus_id: NotRequired[Annotated[str, Field(pattern=r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")]]
    kernel_message: NotRequired[Annotated[str, Field(max_length=500, pattern=r"^[^\x00-\x1f\x7f]*$")]]
    gpu_instance: NotRequired[Annotated[int, Field(ge=0, le=999)] | None]
    compute_instance: NotRequired[Annotated[int, Field(ge=0, le=999)] | None]


@with_config(_CLOSED)
class EccDbeDetails(TypedDict):
    increment: Increment
    total: Total


@with_config(_CLOSED)
class RetirementPendingDetails(TypedDict):
    pending: Total


@with_config(_CLOSED)
class ThrottleStartDetails(TypedDict):
    reasons: Reasons


@with_config(_CLOSED)
class ThrottleEndDetails(TypedDict):
    reasons: Reasons
    duration_s: NotRequired[Annotated[float, Field(ge=0, le=10**9)]]


@with_config(_CLOSED)
class GpuLostDetails(TypedDict):
    last_seen: TimeText


@with_config(_CLOSED)
class NoDetails(TypedDict):
    """Kinds whose kind says it all (row remap failure, GPU back): no details at all."""


# By the value of shared.contract.models.EventKind.
DETAILS_BY_KIND: dict[str, type] = {
    "xid": XidDetails,
    "ecc_dbe": EccDbeDetails,
    "row_remap_failure": NoDetails,
    "retirement_pending": RetirementPendingDetails,
    "throttle_start": ThrottleStartDetails,
    "throttle_end": ThrottleEndDetails,
    "gpu_lost": GpuLostDetails,
    "gpu_back": NoDetails,
}

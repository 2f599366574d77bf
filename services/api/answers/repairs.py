"""The repair marks' and remedies' answers: one as stored, and a GPU's (its audit trail)."""

from __future__ import annotations

from shared.store.remedies import Remedy as RemedyKind
from shared.store.repairs import RepairKind

from . import Answer, ApiTime


class Repair(Answer):
    """An operator's word that a GPU was repaired in place, or came back from repair."""

    id: int
    gpu_uuid: str
    time: ApiTime
    kind: RepairKind
    marked_by: str
    note: str


class Repairs(Answer):
    gpu_uuid: str
    repairs: list[Repair]


class Remedy(Answer):
    """A GPU reset or node reboot that was carried out: by the remediator (its plan), an operator by hand,
    or the GPU itself (its NVML recovery action back to none)."""

    id: int
    gpu_uuid: str
    at: ApiTime
    remedy: RemedyKind
    source: str
    plan_id: int | None
    actor: str
    note: str


class Remedies(Answer):
    gpu_uuid: str
    remedies: list[Remedy]

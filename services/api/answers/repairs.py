"""The repair marks' answers: one mark as stored, and a GPU's marks (its audit trail)."""

from __future__ import annotations

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

"""What every driver answers (`DriverResult`), how it fails (`DriverError`), and what a scheduler driver does.

A scheduler driver takes a node out (Kubernetes: cordon and a taint naming the
finding; Slurm: drain with a reason naming it), drains it one look at a time
(the executor calls `drain` again until it is done or past its deadline), and
puts back only a node that carries the remediator's own mark. Every call is
idempotent: a restart that repeats a step finds the node as the step left it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from shared.plumbing.errors import GpuHealthError

SchedulerName = Literal["kubernetes", "slurm"]
# ok: done; in_progress: look again later; not_owned: someone else's cordon or drain, left as it is
ResultStatus = Literal["ok", "in_progress", "not_owned", "failed"]


class DriverError(GpuHealthError):
    """A driver could not do what it was asked; `retriable` when trying again later can help."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class DriverResult:
    status: ResultStatus
    response: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


class SchedulerDriver(Protocol):
    name: SchedulerName

    def take_out(self, node: str, *, finding: str, plan_id: int) -> DriverResult:
        """Cordon (Slurm: drain) `node`, marked as the remediator's; not_owned when someone else had."""
        ...

    def drain(self, node: str, *, past_deadline: bool) -> DriverResult:
        """One look at the drain: ok when nothing is left, in_progress while something is, failed past the
        deadline when what is left may not be left."""
        ...

    def put_back(self, node: str) -> DriverResult:
        """Uncordon (Slurm: resume) `node` if it carries the remediator's mark; not_owned otherwise."""
        ...

    def close(self) -> None: ...

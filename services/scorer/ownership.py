"""Which GPUs this scorer process judges: those keyed to the gpu-events partitions its group gave it.

N scorer processes share the fleet through one Kafka consumer group on
gpu-events (GPUHEALTH_SCORER__GROUP). The group assigns each process some of the
topic's partitions; the process judges exactly the GPUs whose UUID, as a record
key, falls in one of them, computed with the producers' own partitioner
(shared.plumbing.kafka.key_partition). Its event fast path reads those partitions, and its
cycle judges those GPUs. When a process joins, leaves or dies, the group
rebalances and the GPUs move with their partitions; nothing moves with them,
because open alerts, counters and predictions live in the database.

A scorer that is not in a group (the fast path off, or one fixed as-of time)
owns every GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from shared.plumbing.kafka import key_partition


@dataclass(frozen=True, slots=True)
class Share:
    """The partitions held, out of how many; `everything`: not in a group, every GPU is ours."""

    partitions: frozenset[int] = frozenset()
    count: int = 0
    everything: bool = False

    def owns(self, gpu_uuid: str) -> bool:
        if self.everything:
            return True
        return self.count > 0 and key_partition(gpu_uuid, self.count) in self.partitions

    def select(self, gpus: Iterable[str]) -> list[str]:
        """The GPUs of `gpus` this share holds, in their order."""
        return [g for g in gpus if self.owns(g)]


class Ownership:
    """The share this process holds now, swapped whole as the group rebalances (from the consumer's thread)
    and read by the cycle's; `changed` is set on every change, for the cycle to judge its new GPUs at once."""

    def __init__(self, *, everything: bool = False) -> None:
        self._share = Share(everything=everything)
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self.generation = 0  # bumped at each change: a cycle can tell it judged an old share

    @property
    def share(self) -> Share:
        return self._share

    def assigned(self, partitions: Iterable[int], count: int) -> None:
        """Partitions added to this process's share, out of `count` in the topic."""
        with self._lock:
            held = self._share.partitions | frozenset(partitions)
            self._replace(Share(held, count))

    def revoked(self, partitions: Iterable[int]) -> None:
        """Partitions taken from this process's share (revoked, or lost with the group)."""
        with self._lock:
            self._replace(Share(self._share.partitions - frozenset(partitions), self._share.count))

    def _replace(self, share: Share) -> None:
        self._share = share
        self.generation += 1
        self.changed.set()

"""Discrete events, found by comparing each GPU's sample with its previous one.

- ``xid``: one event per XID. Where the source lists every XID since its last
  read (NVML's event set, dcgm-exporter's per-code counts), each one in the
  list is an event, repeats included; otherwise (a bare dcgm-exporter) the
  last-XID value changing to a non-zero code is one. XIDs from the kernel log
  (``kernel_xids``) join them; the same XID seen by both is one event
  (xid_ledger), whichever origins see it and in whatever order; with `fold_s`,
  repeats of one XID on one GPU within that window are one event with their
  count and first and last time (xid_fold). A bare last-XID gauge shows the
  newest XID that still stands, so it goes back to an earlier code when a later
  XID clears: it counts a code once until the GPU is reset (the gauge reads 0)
  or comes back after being lost (it was re-initialised, so a non-zero last XID
  on its first sample back is a new XID even if it equals the one before the
  loss: a second fall off the bus logs XID 79 again). A repeat of a code after
  another is seen where the source lists every XID (or in the kernel log), as a
  gauge cannot tell it from the gauge going back. The driver's
  fell-off-the-bus line without an XID is XID 79 (kernel_log); its repeats
  until the GPU is seen again are the same fall;
- ``ecc_dbe``: the volatile double-bit ECC count grew;
- ``row_remap_failure`` / ``retirement_pending``: the flag or count went up;
- ``throttle_start`` / ``throttle_end``: a throttling reason (power cap, HW
  slowdown, thermal, power brake) appeared / all of them cleared; idle, sync
  boost and application-clock reasons are not throttling;
- ``gpu_lost`` / ``gpu_back``: a GPU that a source reported is missing from a
  successful read of that same source / reappears. A failed read is a source
  error, not a lost GPU.

A GPU seen for the first time only sets the baseline, so a restarted
collector does not re-announce old faults (listed XIDs happened after the
source started watching, so they are always new).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuhealth.contract.wire_time import wire_time
from gpuhealth.gpu.driver_codes import ClockEventReason as Reason
from shared.contract.models import Details, EventKind, GpuEvent, GpuSample, Source

from .kernel_log import KernelXid, normalize_pci
from .xid_fold import XidFolder
from .xid_ledger import XidLedger

log = logging.getLogger(__name__)
# Kernel-log XIDs for a PCI address no source has reported yet wait this long, at most this many.
PENDING_FOR = timedelta(minutes=5)
MAX_PENDING = 1000

THROTTLING = (
    Reason.SW_POWER_CAP
    | Reason.HW_SLOWDOWN
    | Reason.SW_THERMAL_SLOWDOWN
    | Reason.HW_THERMAL_SLOWDOWN
    | Reason.HW_POWER_BRAKE_SLOWDOWN
)


# The fell-off-the-bus lines of one GPU within this long, with no sample of it between, are one fall.
FALL_JOINS = timedelta(minutes=5)


@dataclass(slots=True)
class _Last:
    sample: GpuSample
    throttle_since: datetime | None = None
    # the codes a bare last-XID gauge has shown since the GPU was last reset or came back
    gauge_shown: frozenset[int] = frozenset()


@dataclass(slots=True)
class EventDetector:
    collector_id: str
    # Kernel-log XIDs are this host's: only its own GPUs (by sample hostname) are matched.
    local_hostname: str | None = None
    _last: dict[str, _Last] = field(default_factory=dict)
    _present: dict[str, set[str]] = field(default_factory=dict)  # source target -> UUIDs
    _lost: dict[str, GpuSample] = field(default_factory=dict)
    _by_pci: dict[str, str] = field(default_factory=dict)  # PCI bus id -> GPU UUID
    # (hostname, PCI bus id) -> GPU UUID: for XIDs that name their host (a mock fleet node's journal)
    _by_host_pci: dict[tuple[str, str], str] = field(default_factory=dict)
    _pending: list[tuple[str, KernelXid]] = field(default_factory=list)  # (feed, XID)
    _taken: list[tuple[str, KernelXid]] = field(default_factory=list)  # this poll's, not yet matched
    _fallen: dict[str, datetime] = field(default_factory=dict)  # GPU UUID -> its last fell-off-the-bus line
    xids: XidLedger = field(default_factory=XidLedger)
    # Repeats of one XID on one GPU within this many seconds are one event (xid_fold.py); 0: each its own.
    fold_s: float = 0.0
    folds: XidFolder | None = None

    def __post_init__(self) -> None:
        if self.fold_s > 0 and self.folds is None:
            self.folds = XidFolder(window_s=self.fold_s)

    def observe(
        self,
        target: str,
        source: Source,
        samples: list[GpuSample],
        at: datetime,
        xids: Mapping[str, Sequence[int]] | None = None,
    ) -> list[GpuEvent]:
        """Events from one successful read of `target`; `xids`: GPU UUID -> every XID it listed."""
        events: list[GpuEvent] = []
        seen = {s.gpu_uuid for s in samples}
        listed = xids or {}
        for sample in samples:
            if sample.pci_bus_id:
                pci = normalize_pci(sample.pci_bus_id) or sample.pci_bus_id
                self._by_host_pci[(sample.hostname, pci)] = sample.gpu_uuid
                if self.local_hostname in (None, sample.hostname):
                    self._by_pci[pci] = sample.gpu_uuid
        # The kernel log's lines taken this poll go first: their times are the XIDs' own, where the
        # source's are only when it was read, and the first report of an XID gives its event's time.
        events += self._match_kernel(at, keep=True)
        for sample in samples:
            returned = sample.gpu_uuid in self._lost
            if returned:
                del self._lost[sample.gpu_uuid]
                events.append(self._event(sample, EventKind.GPU_BACK, sample.time, {}))
            codes = listed.get(sample.gpu_uuid)
            since = self._since(sample.gpu_uuid)
            for code in codes or ():
                events += self._xid(sample, code, sample.source.value, sample.time, {}, since=since)
            events += self._compare(sample, xids_listed=codes is not None, returned=returned)
        for uuid in sorted(self._present.get(target, set()) - seen):
            last = self._last.get(uuid)
            if last is not None and uuid not in self._lost:
                self._lost[uuid] = last.sample
                events.append(
                    self._event(
                        last.sample,
                        EventKind.GPU_LOST,
                        at,
                        {"last_seen": wire_time(last.sample.time)},
                        source=source,
                    )
                )
        self._present[target] = seen
        return events

    def take_kernel_xids(self, feed: str, found: list[KernelXid]) -> None:
        """XIDs read from the kernel log this poll, before the sources are read: `observe` matches them
        to their GPUs ahead of the sources' own reports, `kernel_xids` whatever is left."""
        self._taken += [(feed, x) for x in found]

    def kernel_xids(self, feed: str, found: list[KernelXid], at: datetime) -> list[GpuEvent]:
        """Events for XIDs read from the kernel log, matched to GPUs by PCI bus id."""
        self.take_kernel_xids(feed, found)
        return self._match_kernel(at, keep=False)

    def _match_kernel(self, at: datetime, *, keep: bool) -> list[GpuEvent]:
        """Events for the kernel XIDs taken and pending whose GPU is known; the others wait (`keep`: in
        this poll's list; else pending, for at most PENDING_FOR and MAX_PENDING of them)."""
        events: list[GpuEvent] = []
        waiting, self._pending, self._taken = [*self._pending, *self._taken], [], []
        for origin, xid in waiting:
            if xid.hostname is not None:
                uuid = self._by_host_pci.get((xid.hostname, xid.pci_bus_id), "")
            else:
                uuid = self._by_pci.get(xid.pci_bus_id, "")
            last = self._last.get(uuid)
            if last is not None:
                details: Details = {
                    "origin": origin,
                    "pci_bus_id": xid.pci_bus_id,
                    "kernel_message": xid.message,
                    "gpu_instance": xid.gpu_instance,
                    "compute_instance": xid.compute_instance,
                }
                if xid.inferred:
                    if self._same_fall(uuid, last.sample, xid.time):
                        continue
                    details["inferred"] = "fell_off_the_bus"  # the line names no XID
                    # its own origin: the XID 79 line the driver may also write is the same fall
                    origin = f"{origin}/bus"
                events += self._xid(last.sample, xid.xid, origin, xid.time, details)
            elif keep:
                self._taken.append((origin, xid))
            elif at - xid.time <= PENDING_FOR and len(self._pending) < MAX_PENDING:
                self._pending.append((origin, xid))
            else:
                log.warning("XID %d at %s: no GPU with that PCI address", xid.xid, xid.pci_bus_id)
        return events

    def flush(self, now: datetime) -> list[GpuEvent]:
        """The folded XIDs whose window ended by `now` (call it every poll)."""
        return self.folds.due(now) if self.folds is not None else []

    def flush_all(self) -> list[GpuEvent]:
        """Every folded XID, its window over or not (the collector is stopping)."""
        return self.folds.close_all() if self.folds is not None else []

    def _since(self, gpu_uuid: str) -> datetime | None:
        """When this GPU was last read: what a source lists now happened after it."""
        last = self._last.get(gpu_uuid)
        return last.sample.time if last is not None else None

    def _same_fall(self, gpu_uuid: str, latest: GpuSample, at: datetime) -> bool:
        """Whether a fell-off-the-bus line repeats one already counted, with no sample of the GPU between."""
        before = self._fallen.get(gpu_uuid)
        self._fallen[gpu_uuid] = at
        return before is not None and at - before <= FALL_JOINS and latest.time <= before

    def _xid(
        self,
        sample: GpuSample,
        code: int,
        origin: str,
        at: datetime,
        extra: Details,
        *,
        since: datetime | None = None,
    ) -> list[GpuEvent]:
        if not self.xids.admit(sample.gpu_uuid, code, origin, at, since):
            return []  # the same XID, already counted through another origin

        def first() -> GpuEvent:
            when = self.xids.stamp(sample.gpu_uuid, at)
            return self._event(sample, EventKind.XID, when, {"xid": code, **extra})

        if self.folds is None:
            return [first()]
        return self.folds.add(sample.gpu_uuid, code, at, first)

    def _compare(
        self, now: GpuSample, *, xids_listed: bool = False, returned: bool = False
    ) -> list[GpuEvent]:
        last = self._last.get(now.gpu_uuid)
        shown = frozenset() if last is None or returned or not now.xid_last else last.gauge_shown
        self._last[now.gpu_uuid] = state = _Last(
            now, last.throttle_since if last else None, shown | {now.xid_last} if now.xid_last else shown
        )
        if last is None:
            if (now.clocks_event_reasons or 0) & THROTTLING:
                state.throttle_since = now.time
            return []
        before, t = last.sample, now.time
        events = []
        # a bare gauge: a code it has not shown since the GPU's reset (a code it shows again is the gauge
        # going back to an older XID after a newer one cleared, not a new one). It may show an older XID
        # for the first time (a newer one hid it until it cleared), so it can be any not yet reported
        # within the ledger's horizon, not only one since the previous read.
        if not xids_listed and now.xid_last and now.xid_last not in shown:
            events += self._xid(now, now.xid_last, now.source.value, t, {}, since=t - self.xids.horizon)
        if _grew(before.ecc_dbe_volatile_total, now.ecc_dbe_volatile_total):
            grown = (now.ecc_dbe_volatile_total or 0) - (before.ecc_dbe_volatile_total or 0)
            dbe: Details = {"increment": grown, "total": now.ecc_dbe_volatile_total}
            events.append(self._event(now, EventKind.ECC_DBE, t, dbe))
        if now.row_remap_failure and not before.row_remap_failure:
            events.append(self._event(now, EventKind.ROW_REMAP_FAILURE, t, {}))
        if _grew(before.retired_pages_pending, now.retired_pages_pending):
            events.append(
                self._event(now, EventKind.RETIREMENT_PENDING, t, {"pending": now.retired_pages_pending})
            )
        was = (before.clocks_event_reasons or 0) & THROTTLING
        is_ = (now.clocks_event_reasons or 0) & THROTTLING
        if is_ and not was:
            state.throttle_since = t
            events.append(self._event(now, EventKind.THROTTLE_START, t, {"reasons": Reason.names(is_)}))
        elif was and not is_:
            since = state.throttle_since
            state.throttle_since = None
            ended: Details = {"reasons": Reason.names(was)}
            if since is not None:
                ended["duration_s"] = round((t - since).total_seconds(), 3)
            events.append(self._event(now, EventKind.THROTTLE_END, t, ended))
        return events

    def _event(
        self,
        sample: GpuSample,
        kind: EventKind,
        at: datetime,
        details: Details,
        *,
        source: Source | None = None,
    ) -> GpuEvent:
        return GpuEvent(
            time=at,
            kind=kind,
            gpu_uuid=sample.gpu_uuid,
            hostname=sample.hostname,
            source=source or sample.source,
            collector_id=self.collector_id,
            cluster=sample.cluster,
            datacenter=sample.datacenter,
            rack=sample.rack,
            details=details,
        )


def _grew(before: int | None, now: int | None) -> bool:
    return before is not None and now is not None and now > before

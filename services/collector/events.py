"""Discrete events, found by comparing each GPU's sample with its previous one.

- ``xid``: the last-XID value changed to a non-zero code (dcgm-exporter shows
  only the latest XID, so a repeat of the same code between two polls is not
  visible through it; the NVML source sees every XID through NVML's events).
  A GPU that comes back after being lost was re-initialised, so a non-zero
  last XID on its first sample back is a new XID even if it equals the one
  before the loss (a second fall off the bus logs XID 79 again);
- ``ecc_dbe``: the volatile double-bit ECC count grew;
- ``row_remap_failure`` / ``retirement_pending``: the flag or count went up;
- ``throttle_start`` / ``throttle_end``: a throttling reason (power cap, HW
  slowdown, thermal, power brake) appeared / all of them cleared; idle, sync
  boost and application-clock reasons are not throttling;
- ``gpu_lost`` / ``gpu_back``: a GPU that a source reported is missing from a
  successful read of that same source / reappears. A failed read is a source
  error, not a lost GPU.

A GPU seen for the first time only sets the baseline, so a restarted
collector does not re-announce old faults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from shared.dcgm import ClockEventReason as Reason
from shared.models import Details, EventKind, GpuEvent, GpuSample, Source

THROTTLING = (
    Reason.SW_POWER_CAP
    | Reason.HW_SLOWDOWN
    | Reason.SW_THERMAL_SLOWDOWN
    | Reason.HW_THERMAL_SLOWDOWN
    | Reason.HW_POWER_BRAKE_SLOWDOWN
)


@dataclass(slots=True)
class _Last:
    sample: GpuSample
    throttle_since: datetime | None = None


@dataclass(slots=True)
class EventDetector:
    collector_id: str
    _last: dict[str, _Last] = field(default_factory=dict)
    _present: dict[str, set[str]] = field(default_factory=dict)  # source target -> UUIDs
    _lost: dict[str, GpuSample] = field(default_factory=dict)

    def observe(self, target: str, source: Source, samples: list[GpuSample], at: datetime) -> list[GpuEvent]:
        """Events from one successful read of `target`."""
        events: list[GpuEvent] = []
        seen = {s.gpu_uuid for s in samples}
        for sample in samples:
            returned = sample.gpu_uuid in self._lost
            if returned:
                del self._lost[sample.gpu_uuid]
                events.append(self._event(sample, EventKind.GPU_BACK, sample.time, {}))
            events += self._compare(sample, returned=returned)
        for uuid in sorted(self._present.get(target, set()) - seen):
            last = self._last.get(uuid)
            if last is not None and uuid not in self._lost:
                self._lost[uuid] = last.sample
                events.append(
                    self._event(
                        last.sample,
                        EventKind.GPU_LOST,
                        at,
                        {"last_seen": last.sample.time.isoformat()},
                        source=source,
                    )
                )
        self._present[target] = seen
        return events

    def _compare(self, now: GpuSample, *, returned: bool = False) -> list[GpuEvent]:
        last = self._last.get(now.gpu_uuid)
        self._last[now.gpu_uuid] = state = _Last(now, last.throttle_since if last else None)
        if last is None:
            if (now.clocks_event_reasons or 0) & THROTTLING:
                state.throttle_since = now.time
            return []
        before, t = last.sample, now.time
        events = []
        if now.xid_last and (returned or now.xid_last != before.xid_last):
            events.append(self._event(now, EventKind.XID, t, {"xid": now.xid_last}))
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
            events.append(self._event(now, EventKind.THROTTLE_START, t, {"reasons": Reason.decode(is_)}))
        elif was and not is_:
            since = state.throttle_since
            state.throttle_since = None
            ended: Details = {"reasons": Reason.decode(was)}
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

"""Folding floods: repeats of one XID on one GPU within the window are one event, and no line is lost."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.gpu.readings import GpuReading, SourceReading
from services.collector.enrich import Enricher, Placement
from services.collector.events import EventDetector
from services.collector.kernel_log import KernelXid
from services.collector.xid_fold import XidFolder
from shared.contract.models import EventKind, GpuEvent, GpuSample, Source, parse_event, to_json

T = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
GPUS = [(f"GPU-0000000{i}-2222-3333-4444-555555555555", f"00000000:{0x18 + i:02X}:00.0") for i in range(3)]
ENRICH = Enricher(collector_id="c-1", local_hostname="node-7", placement=Placement(cluster="prod"))
WINDOW_S = 10.0


def samples(at: datetime) -> list[GpuSample]:
    readings = [
        GpuReading(uuid=uuid, index=i, model="NVIDIA H100 80GB HBM3", pci_bus_id=bus, time=at, metrics={})
        for i, (uuid, bus) in enumerate(GPUS)
    ]
    made = [ENRICH.sample(r, SourceReading(Source.NVML, "nvml", readings, at, 1.0)) for r in readings]
    return [s for s in made if s is not None]


def detector(fold_s: float = WINDOW_S) -> EventDetector:
    d = EventDetector(collector_id="c-1", fold_s=fold_s)
    d.observe("nvml", Source.NVML, samples(T), T, xids={})
    return d


def lines_of(event: GpuEvent) -> int:
    return int(str(event.details.get("count", 1)))


def last_of(event: GpuEvent) -> datetime:
    last = event.details.get("last")
    return datetime.fromisoformat(last) if isinstance(last, str) else event.time


def finals(
    published: list[tuple[datetime, GpuEvent]],
) -> dict[tuple[str, datetime], tuple[datetime, GpuEvent]]:
    """Each event's final word, as the sink keeps it (the highest count), with when it was published."""
    out: dict[tuple[str, datetime], tuple[datetime, GpuEvent]] = {}
    for at, event in published:
        key = (event.gpu_uuid, event.time)
        if key not in out or lines_of(event) > lines_of(out[key][1]):
            out[key] = (at, event)
    return out


line_st = st.tuples(
    st.integers(0, 2),  # GPU
    st.sampled_from([13, 79, 95]),  # XID
    st.integers(0, 3000),  # ms after the line before
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(line_st, max_size=200),
    poll_ms=st.sampled_from([250, 1000, 2500, 10_000]),
    stop_early=st.booleans(),
)
def test_a_fold_never_loses_a_line_nor_holds_one_past_its_window(
    lines: list[tuple[int, int, int]], poll_ms: int, stop_early: bool
) -> None:
    d = detector()
    timed, at = [], T
    for gpu, code, gap in lines:
        at += timedelta(milliseconds=gap)
        timed.append((at, gpu, code))
    poll = timedelta(milliseconds=poll_ms)
    published: list[tuple[datetime, GpuEvent]] = []
    first_line_poll: dict[tuple[str, int], datetime] = {}
    now, i = T, 0
    end = (timed[-1][0] if timed else T) + timedelta(seconds=WINDOW_S) + 2 * poll
    while now < end:
        now += poll
        arrived = []
        while i < len(timed) and timed[i][0] <= now:
            when, gpu, code = timed[i]
            arrived.append(KernelXid(when, GPUS[gpu][1], code, "flood"))
            first_line_poll.setdefault((GPUS[gpu][0], code), now)
            i += 1
        published += [(now, e) for e in d.kernel_xids("kmsg", arrived, now)]
        published += [(now, e) for e in d.flush(now)]
        if stop_early and i >= len(timed) // 2:
            published += [(now, e) for e in d.flush_all()]  # SIGTERM: everything open goes now
            break
    assert i == len(timed) or stop_early
    kept = finals(published)
    assert sum(lines_of(e) for _, e in kept.values()) == i  # every line counted, exactly once
    for sent, event in kept.values():
        parse_event(json.dumps(to_json(event)))  # the contract takes what the fold publishes
        assert event.time <= last_of(event)
        # published by the first poll after the window that its first line opened
        assert sent <= event.time + timedelta(seconds=WINDOW_S) + poll + timedelta(milliseconds=1)
    for (uuid, code), arrived_at in first_line_poll.items():  # a new XID on a GPU goes in its own poll
        firsts = [t for t, e in published if e.gpu_uuid == uuid and e.details["xid"] == code]
        assert min(firsts) == arrived_at
    for uuid, _ in GPUS:  # (GPU, time, kind) stays unique
        times = [event.time for _, event in kept.values() if event.gpu_uuid == uuid]
        assert len(times) == len(set(times))


def test_a_flood_is_one_event_per_window_and_other_gpus_go_at_once() -> None:
    d = detector()
    flood = [
        KernelXid(T + timedelta(microseconds=100 * n), GPUS[0][1], 95, "Uncontained") for n in range(50_000)
    ]
    other = KernelXid(T + timedelta(seconds=1), GPUS[1][1], 79, "GPU has fallen off the bus.")
    now = T + timedelta(seconds=5)
    first = d.kernel_xids("kmsg", [*flood, other], now)
    assert [(e.gpu_uuid, e.details["xid"]) for e in first] == [(GPUS[0][0], 95), (GPUS[1][0], 79)]
    assert "count" not in first[0].details  # the first line, at once
    assert d.flush(now) == []  # the window is still open
    (closed,) = d.flush(T + timedelta(seconds=WINDOW_S))
    assert (closed.time, closed.details["count"]) == (first[0].time, 50_000)
    assert closed.details["last"] == "2026-11-26T12:00:04.999000Z"
    assert closed.details["kernel_message"] == "Uncontained"  # the first line's


def test_without_a_window_every_line_is_an_event() -> None:
    d = detector(fold_s=0)
    events = d.kernel_xids("kmsg", [KernelXid(T, GPUS[0][1], 95)] * 3, T)
    assert [lines_of(e) for e in events] == [1, 1, 1]
    assert d.flush_all() == []


def test_the_kernel_log_and_the_source_count_one_flood_once() -> None:
    d = detector()
    uuid, bus = GPUS[2]
    logged = [KernelXid(T + timedelta(milliseconds=n), bus, 48) for n in range(100)]
    d.kernel_xids("kmsg", logged, T)
    t1 = T + timedelta(seconds=1)
    d.observe("nvml", Source.NVML, samples(t1), t1, xids={uuid: [48] * 120})  # NVML saw 20 more
    (closed,) = d.flush_all()
    assert closed.details["count"] == 120


def test_a_closed_fold_at_capacity_goes_early_and_counts_whole() -> None:
    folder = XidFolder(window_s=60, max_open=1)
    made: list[GpuEvent] = []

    def first(uuid: str) -> Any:
        def build() -> GpuEvent:
            event = GpuEvent(time=T, kind=EventKind.XID, gpu_uuid=uuid, hostname="h", source=Source.NVML,
                             collector_id="c", details={"xid": 95})  # fmt: skip
            made.append(event)
            return event

        return build

    assert len(folder.add(GPUS[0][0], 95, T, first(GPUS[0][0]))) == 1
    folder.add(GPUS[0][0], 95, T, first(GPUS[0][0]))
    closed, opened = folder.add(GPUS[1][0], 95, T, first(GPUS[1][0]))
    assert (closed.gpu_uuid, closed.details["count"], opened.gpu_uuid) == (GPUS[0][0], 2, GPUS[1][0])
    assert folder.open_folds == 1


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="above 0"):
        XidFolder(window_s=0)


def test_the_collector_publishes_open_folds_on_its_timer_and_when_it_stops() -> None:
    from tests.helpers.collector import FakeProducer, FakeSource, make_collector

    readings = [GpuReading(uuid=u, index=i, model="NVIDIA H100 80GB HBM3", pci_bus_id=b, time=T, metrics={})
                for i, (u, b) in enumerate(GPUS)]  # fmt: skip
    source = FakeSource([SourceReading(Source.NVML, "nvml", readings, T, 1.0) for _ in range(2)])

    class Feed:
        name = "kmsg"

        def __init__(self) -> None:
            at = datetime.now(UTC)  # one time for a batch's lines: each batch is one fold
            early = at - timedelta(seconds=1)  # its window is over by the poll that reads it
            self.batches = [[KernelXid(early, GPUS[0][1], 95)] * 500, [KernelXid(at, GPUS[1][1], 95)] * 7]

        def drain(self) -> list[KernelXid]:
            return self.batches.pop(0)

        def close(self) -> None: ...

    producer = FakeProducer()
    collector, _ = make_collector(source, producer, xid_feeds=[Feed()])
    collector.detector.folds = XidFolder(window_s=0.5)
    collector.poll_once()
    collector.detector.folds.window = timedelta(seconds=3600)  # the second's never does: SIGTERM closes it
    collector.poll_once()
    collector.close()
    counts = [
        (v["gpu_uuid"], v["details"].get("count", 1)) for t, _, v in producer.messages if t == "gpu-events"
    ]
    assert counts == [(GPUS[0][0], 1), (GPUS[0][0], 500), (GPUS[1][0], 1), (GPUS[1][0], 7)]

"""One fault, one count: no source, and no pair of sources, turns one XID occurrence into two.

A GPU's XIDs reach the collector through its last-XID gauge (dcgm-exporter without the
per-code counts: the newest XID that still stands, as the mock fleet shows it), the
kernel log's XID lines, and the driver's fell-off-the-bus line that names no XID. The
hypothesis test plays random faults through every mix of those, in either order within
a poll, with any poll period and kernel log delay, and counts the XID events.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.gpu.readings import GpuReading, SourceReading
from services.collector.enrich import Enricher, Placement
from services.collector.events import EventDetector
from services.collector.kernel_log import KernelXid
from shared.contract.models import EventKind, GpuEvent, GpuSample, Source

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"
BUS = "00000000:3B:00.0"
TARGET = "http://node-7:9400/metrics"
ENRICH = Enricher(collector_id="c-1", local_hostname="node-7", placement=Placement(cluster="prod"))


def sample(at: datetime, xid_last: int) -> GpuSample:
    reading = GpuReading(uuid=UUID, index=0, model="NVIDIA H100 80GB HBM3", pci_bus_id=BUS, time=at,
                         metrics={"xid_last": xid_last})  # fmt: skip
    made = ENRICH.sample(reading, SourceReading(Source.DCGM, TARGET, [reading], at, 1.0))
    assert made is not None
    return made


@dataclass(frozen=True)
class Fault:
    code: int
    start_s: float
    lasts_s: float | None  # None: it stands until the GPU is repaired (a DBE's 48, a fall's 79)


def gauge(faults: list[Fault], t: float) -> int:
    """The last-XID gauge as the mock shows it: the newest XID that still stands (0: none)."""
    standing = [f for f in faults if f.start_s <= t and (f.lasts_s is None or t < f.start_s + f.lasts_s)]
    return max(standing, key=lambda f: f.start_s).code if standing else 0


def counts(events: list[GpuEvent]) -> dict[int, int]:
    found: dict[int, int] = {}
    for e in events:
        if e.kind is EventKind.XID:
            code = int(str(e.details["xid"]))
            found[code] = found.get(code, 0) + 1
    return found


def play(
    faults: list[Fault], *, gauge_on: bool, kernel_on: bool, bus_line: bool, interval_s: float,
    delay_s: float, kernel_first: bool,
) -> dict[int, int]:  # fmt: skip
    """The XID events the collector publishes for these faults, read as the arguments say."""
    d = EventDetector(collector_id="c-1")
    until_s = max(f.start_s + (f.lasts_s or 0) for f in faults) + 2 * interval_s + delay_s
    lines = sorted(
        [(f.start_s, KernelXid(T0 + timedelta(seconds=f.start_s), BUS, f.code, "")) for f in faults]
        + [
            (f.start_s + 0.2, KernelXid(T0 + timedelta(seconds=f.start_s + 0.2), BUS, 79, "", inferred=True))
            for f in faults
            if f.code == 79 and bus_line
        ],
        key=lambda line: line[0],
    )
    events: list[GpuEvent] = []
    sent = 0
    t = -interval_s
    while t <= until_s:
        at = T0 + timedelta(seconds=t)
        due = [x for s, x in lines[sent:] if s <= t - delay_s] if kernel_on else []
        sent += len(due)
        reading = [sample(at, gauge(faults, t) if gauge_on else 0)]
        if kernel_first:
            events += d.kernel_xids("journal", due, at)
            events += d.observe(TARGET, Source.DCGM, reading, at)
        else:
            events += d.observe(TARGET, Source.DCGM, reading, at)
            events += d.kernel_xids("journal", due, at)
        t += interval_s
    return counts(events)


fault = st.builds(
    Fault,
    code=st.sampled_from([13, 45, 48, 79, 94]),
    start_s=st.floats(0, 900, allow_nan=False).map(lambda s: round(s, 3)),
    lasts_s=st.none() | st.floats(5, 600, allow_nan=False),
)


@settings(max_examples=400, deadline=None)
@given(
    faults=st.lists(fault, min_size=1, max_size=5),
    gauge_on=st.booleans(),
    kernel_on=st.booleans(),
    bus_line=st.booleans(),
    interval_s=st.sampled_from([5.0, 10.0, 15.0, 30.0, 60.0, 120.0]),
    delay_s=st.floats(0, 20, allow_nan=False),
    kernel_first=st.booleans(),
)
def test_no_source_or_pair_of_sources_counts_an_xid_twice(
    faults: list[Fault], gauge_on: bool, kernel_on: bool, bus_line: bool, interval_s: float,
    delay_s: float, kernel_first: bool,
) -> None:  # fmt: skip
    seen = play(faults, gauge_on=gauge_on, kernel_on=kernel_on, bus_line=bus_line, interval_s=interval_s,
                delay_s=delay_s, kernel_first=kernel_first)  # fmt: skip
    happened: dict[int, int] = {}
    for f in faults:
        happened[f.code] = happened.get(f.code, 0) + 1
    for code, n in seen.items():
        assert n <= happened.get(code, 0), (code, seen, happened)
    if kernel_on:  # the kernel log writes every XID: each is counted, once
        assert seen == happened


def test_the_held_out_job_crash_counts_its_dbe_once() -> None:
    """A DBE (48, standing until repair); 20 s later the job's crash (45, cleared after 300 s): the gauge
    shows 48, 45, then 48 again, which is the same DBE, read with the kernel log or without it."""
    faults = [Fault(48, 100.0, None), Fault(45, 120.0, 300.0)]
    for kernel_on in (True, False):
        for interval_s in (10.0, 15.0, 60.0):
            seen = play(faults, gauge_on=True, kernel_on=kernel_on, bus_line=False, interval_s=interval_s,
                        delay_s=2.0, kernel_first=False)  # fmt: skip
            assert seen == {48: 1, 45: 1}, (kernel_on, interval_s, seen)


def test_a_gauge_counts_a_code_again_after_the_gpu_was_reset() -> None:
    """Back to 0 (a reset), then the same code again: a new XID."""
    d = EventDetector(collector_id="c-1")
    values = [0, 13, 0, 13, 48, 13, 48]
    events: list[Any] = []
    for k, value in enumerate(values):
        at = T0 + timedelta(seconds=10 * k)
        events += d.observe(TARGET, Source.DCGM, [sample(at, value)], at)
    assert counts(events) == {13: 2, 48: 1}  # the last 13 and 48 are the gauge going back


def test_a_fall_off_the_bus_is_one_xid_79_however_the_driver_says_it() -> None:
    """The XID 79 line, the driver's own fell-off-the-bus line (repeated), and the gauge when the GPU
    comes back: one fall."""
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.DCGM, [sample(T0, 0)], T0)
    fell = T0 + timedelta(seconds=5)
    said = "GPU 0000:3b:00.0: GPU has fallen off the bus."
    lines = [KernelXid(fell, BUS, 79, "GPU has fallen off the bus."),
             KernelXid(fell, BUS, 79, said, inferred=True),
             KernelXid(fell + timedelta(seconds=40), BUS, 79, said, inferred=True)]  # fmt: skip
    at = T0 + timedelta(seconds=10)
    events = d.kernel_xids("kmsg", lines, at)
    events += d.observe(TARGET, Source.DCGM, [], at)  # lost
    back = T0 + timedelta(minutes=20)
    events += d.observe(TARGET, Source.DCGM, [sample(back, 79)], back)
    assert counts(events) == {79: 1}
    assert [e.kind for e in events] == [EventKind.XID, EventKind.GPU_LOST, EventKind.GPU_BACK]


def test_the_bus_line_alone_is_xid_79_and_says_so() -> None:
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.DCGM, [sample(T0, 0)], T0)
    said = ("The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus "
            "and is not responding to commands.")  # fmt: skip
    line = KernelXid(T0, BUS, 79, said, inferred=True)
    (event,) = d.kernel_xids("journal", [line], T0)
    assert (event.details["xid"], event.details["inferred"], event.details["origin"]) == (
        79, "fell_off_the_bus", "journal")  # fmt: skip

"""Every XID is an event: listed XIDs, exporter counts, the kernel log, and one event per XID."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.gpu.readings import GpuReading, SourceError, SourceReading
from services.collector.dcgm_source import DcgmSource, new_xids, parse_exposition
from services.collector.enrich import Enricher, Placement
from services.collector.events import PENDING_FOR, EventDetector
from services.collector.kernel_log import KernelXid
from shared.contract.models import EventKind, GpuEvent, GpuSample, MigInstance, Source
from shared.gpu.dcgm import FIELDS

T = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"
BUS = "00000000:3B:00.0"
TARGET = "nvml"
ENRICH = Enricher(collector_id="c-1", local_hostname="node-7", placement=Placement(cluster="prod"))


def sample(at: datetime, source: Source = Source.NVML, **metrics: Any) -> GpuSample:
    reading = GpuReading(uuid=UUID, index=0, model="NVIDIA H100 80GB HBM3", pci_bus_id=BUS, time=at,
                         metrics=metrics)  # fmt: skip
    made = ENRICH.sample(reading, SourceReading(source, TARGET, [reading], at, 1.0))
    assert made is not None
    return made


def xid_events(events: list[GpuEvent]) -> list[tuple[int, datetime]]:
    return [(int(str(e.details["xid"])), e.time) for e in events if e.kind is EventKind.XID]


def test_two_xids_in_one_poll_are_two_events_with_distinct_times() -> None:
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.NVML, [sample(T)], T, xids={UUID: []})
    t1 = T + timedelta(seconds=10)
    events = d.observe(TARGET, Source.NVML, [sample(t1, xid_last=94)], t1, xids={UUID: [48, 94]})
    ms = timedelta(milliseconds=1)
    assert xid_events(events) == [(48, t1), (94, t1 + ms)]  # (gpu, time, kind) stays unique
    assert events[0].details == {"xid": 48}


def test_a_repeated_xid_is_an_event_every_time() -> None:
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.NVML, [sample(T)], T, xids={UUID: [13]})
    t1 = T + timedelta(seconds=10)
    events = d.observe(TARGET, Source.NVML, [sample(t1, xid_last=13)], t1, xids={UUID: [13, 13]})
    assert [code for code, _ in xid_events(events)] == [13, 13]
    t2 = t1 + timedelta(seconds=10)
    # the same last-XID value with nothing listed: no new XID
    assert d.observe(TARGET, Source.NVML, [sample(t2, xid_last=13)], t2, xids={UUID: []}) == []


def test_a_first_sight_lists_its_xids_too() -> None:
    """Listed XIDs happened after the source began watching: never an old fault re-announced."""
    d = EventDetector(collector_id="c-1")
    events = d.observe(TARGET, Source.NVML, [sample(T, xid_last=79)], T, xids={UUID: [79]})
    assert xid_events(events) == [(79, T)]


def test_without_a_list_the_last_xid_changing_is_the_event() -> None:
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.DCGM, [sample(T, Source.DCGM, xid_last=0)], T)
    t1 = T + timedelta(seconds=10)
    (event,) = d.observe(TARGET, Source.DCGM, [sample(t1, Source.DCGM, xid_last=43)], t1)
    assert (event.kind, event.details, event.time) == (EventKind.XID, {"xid": 43}, t1)


def test_the_kernel_log_and_nvml_seeing_one_xid_make_one_event() -> None:
    d = EventDetector(collector_id="c-1")
    d.observe(TARGET, Source.NVML, [sample(T)], T, xids={UUID: []})
    t1 = T + timedelta(seconds=10)
    logged = [KernelXid(t1 - timedelta(seconds=3), BUS, 79, "GPU has fallen off the bus."),
              KernelXid(t1 - timedelta(seconds=2), BUS, 79, "GPU has fallen off the bus.")]  # fmt: skip
    first = d.kernel_xids("kmsg", logged, t1)
    assert [e.details["origin"] for e in first] == ["kmsg", "kmsg"]
    assert first[0].details["pci_bus_id"] == BUS
    assert first[0].gpu_uuid == UUID
    assert (first[0].cluster, first[0].hostname) == ("prod", "node-7")
    # NVML reports the same two, and one more: only the third is new
    again = d.observe(TARGET, Source.NVML, [sample(t1, xid_last=79)], t1, xids={UUID: [79, 79, 79]})
    assert [code for code, _ in xid_events(again)] == [79]
    times = [e.time for e in [*first, *again]]
    assert len(set(times)) == 3


def test_kernel_xids_wait_for_their_gpu_and_give_up_after_a_while() -> None:
    d = EventDetector(collector_id="c-1")
    early = KernelXid(T, BUS, 48, "DBE", gpu_instance=2)
    assert d.kernel_xids("journal", [early], T) == []  # no source has named this PCI address yet
    d.observe(TARGET, Source.NVML, [sample(T)], T)
    (event,) = d.kernel_xids("journal", [], T + timedelta(seconds=10))
    assert (event.gpu_uuid, event.details["xid"], event.details["gpu_instance"]) == (UUID, 48, 2)
    stale = KernelXid(T, "00000000:99:00.0", 79)
    assert d.kernel_xids("kmsg", [stale], T) == []
    assert d.kernel_xids("kmsg", [], T + PENDING_FOR + timedelta(seconds=1)) == []
    assert d._pending == []


def page(counts: dict[int, int], *, uuid: str = UUID) -> str:
    lines = ["# HELP DCGM_EXP_XID_ERRORS_COUNT Count of XID errors within the window.",
             "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge",
             f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{uuid}"}} {max(counts, default=0)}']  # fmt: skip
    lines += [f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{uuid}",xid="{c}"}} {n}' for c, n in counts.items()]
    return "\n".join(lines) + "\n"


class FakeClient:
    def __init__(self, pages: list[str]) -> None:
        self.pages = pages

    def get(self, url: str) -> Any:
        import httpx

        return httpx.Response(200, text=self.pages.pop(0), request=httpx.Request("GET", url))

    def close(self) -> None: ...


def test_exporter_xid_counts_become_listed_xids() -> None:
    pages = [page({48: 1}), page({48: 2, 94: 1}), page({94: 1}), page({94: 1, 48: 1}), page({})]
    source = DcgmSource("http://n:9400/metrics", client=FakeClient(pages))  # type: ignore[arg-type]
    listed = [source.read().gpus[0].xids for _ in range(5)]
    # first scrape: the baseline; then the rises: a 48 with a 94 in one scrape both count
    assert listed == [[], [48, 94], [], [48], []]


def test_a_page_without_the_count_family_lists_nothing() -> None:
    text = f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{UUID}"}} 48\n'
    (gpu,) = parse_exposition(text, scraped_at=T)
    assert (gpu.xid_counts, gpu.xids, gpu.metrics["xid_last"]) == (None, None, 48)


def test_hostile_xid_counts_are_bounded_or_ignored() -> None:
    text = (
        f'DCGM_EXP_XID_ERRORS_COUNT{{UUID="{UUID}",xid="48"}} 1e18\n'
        f'DCGM_EXP_XID_ERRORS_COUNT{{UUID="{UUID}",xid="²"}} 3\n'
        f'DCGM_EXP_XID_ERRORS_COUNT{{UUID="{UUID}",xid="-1"}} 3\n'
        f'DCGM_EXP_XID_ERRORS_COUNT{{UUID="{UUID}",xid="13"}} 9223372036854775794\n'
        f'DCGM_EXP_XID_ERRORS_COUNT{{UUID="{UUID}",xid="31"}} 4\n'
    )
    (gpu,) = parse_exposition(text, scraped_at=T)
    assert gpu.xid_counts == {31: 4}
    assert len(new_xids({}, {48: 10**12})) == 1000


@settings(max_examples=200, deadline=None)
@given(
    before=st.dictionaries(st.integers(1, 200), st.integers(0, 50), max_size=8),
    now=st.dictionaries(st.integers(1, 200), st.integers(0, 50), max_size=8),
)
def test_listed_xids_are_exactly_the_rises(before: dict[int, int], now: dict[int, int]) -> None:
    listed = new_xids(before, now)
    assert listed == sorted(listed)
    for code in set(before) | set(now):
        assert listed.count(code) == max(0, now.get(code, 0) - before.get(code, 0))
    assert new_xids(None, now) == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_exposition_text_is_readings_or_a_source_error(text: str) -> None:
    try:
        gpus = parse_exposition(text, scraped_at=T)
    except SourceError:
        return
    for gpu in gpus:
        assert all(v is None or isinstance(v, int | float) for v in gpu.metrics.values())
        assert gpu.xid_counts is None or all(0 < c <= 100_000 for c in gpu.xid_counts)


def test_mig_instances_keep_every_profiling_field_the_exporter_gives() -> None:
    labels = f'gpu="0",UUID="{UUID}",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"'
    values = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.81, "DCGM_FI_PROF_SM_ACTIVE": 0.7,
              "DCGM_FI_PROF_SM_OCCUPANCY": 0.4, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.55,
              "DCGM_FI_PROF_DRAM_ACTIVE": 0.62, "DCGM_FI_PROF_PCIE_TX_BYTES": 1000,
              "DCGM_FI_PROF_PCIE_RX_BYTES": 2000, "DCGM_FI_DEV_FB_USED": 4384}  # fmt: skip
    text = "".join(f"{name}{{{labels}}} {v}\n" for name, v in values.items())
    (gpu,) = parse_exposition(text, scraped_at=T)
    (entry,) = gpu.mig
    assert entry == {
        "profile": "3g.40gb", "instance_id": 2, "prof_gr_engine_active_ratio": 0.81,
        "prof_sm_active_ratio": 0.7, "prof_sm_occupancy_ratio": 0.4, "prof_tensor_active_ratio": 0.55,
        "prof_dram_active_ratio": 0.62, "pcie_tx_bytes_per_s": 1000, "pcie_rx_bytes_per_s": 2000,
        "fb_used_mib": 4384,
    }  # fmt: skip
    MigInstance.model_validate(entry)


def test_every_profiling_field_has_a_place_in_a_mig_instance() -> None:
    profiling = {f.sample_field for f in FIELDS if f.name.startswith("DCGM_FI_PROF_")}
    assert profiling <= set(MigInstance.model_fields)


class FakeFeed:
    name = "kmsg"

    def __init__(self, batches: list[list[KernelXid] | Exception]) -> None:
        self.batches = batches
        self.closed = False

    def drain(self) -> list[KernelXid]:
        batch = self.batches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        return batch

    def close(self) -> None:
        self.closed = True


def test_the_poll_publishes_kernel_xids_beside_the_source_and_survives_a_failing_feed() -> None:
    from tests.helpers.collector import FakeProducer, FakeSource, make_collector, value

    gpu = GpuReading(uuid=UUID, index=0, model="NVIDIA H100 80GB HBM3", pci_bus_id=BUS, time=T,
                     metrics={}, xids=[])  # fmt: skip
    readings: list[SourceReading | Exception] = [
        SourceReading(Source.NVML, TARGET, [gpu], T, 1.0) for _ in range(3)
    ]
    feed = FakeFeed([[KernelXid(T, BUS, 79, "fallen off the bus")], SourceError("EPERM"), []])
    producer = FakeProducer()
    collector, metrics = make_collector(FakeSource(readings), producer, xid_feeds=[feed])
    assert collector.poll_once() == (1, 1)
    assert collector.poll_once() == (1, 0)  # the feed's failure is counted, the samples still go
    assert collector.poll_once() == (1, 0)
    (event,) = [v for t, _, v in producer.messages if t == "gpu-events"]
    assert (event["kind"], event["gpu_uuid"], event["details"]["xid"]) == ("xid", UUID, 79)
    assert value(metrics, "source_errors", target="kmsg") == 1


def test_kernel_log_off_by_default_and_a_feed_that_cannot_open_is_skipped(monkeypatch: Any) -> None:
    import services.collector.build as main
    from services.collector.settings import CollectorSection

    assert main.make_xid_feeds(CollectorSection()) == []

    def refuse(kind: str) -> Any:
        raise SourceError("cannot read the kernel log at /dev/kmsg: [Errno 1] Operation not permitted")

    monkeypatch.setattr(main, "open_kernel_log", refuse)
    assert main.make_xid_feeds(CollectorSection(kernel_log="auto")) == []
    monkeypatch.setattr(main, "open_kernel_log", lambda kind: FakeFeed([]))
    (feed,) = main.make_xid_feeds(CollectorSection(kernel_log="kmsg"))
    assert feed.name == "kmsg"


def test_kernel_xids_only_match_this_hosts_gpus() -> None:
    d = EventDetector(collector_id="c-1", local_hostname="elsewhere")
    d.observe(TARGET, Source.NVML, [sample(T)], T)  # a GPU of node-7 with the same PCI address
    assert d.kernel_xids("kmsg", [KernelXid(T, BUS, 79)], T) == []
    assert d._pending  # held for a GPU of this host, which never comes

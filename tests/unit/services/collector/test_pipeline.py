"""Enrichment, event detection, publishing and the poll schedule, with fake Kafka and sources."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.gpu.readings import GpuReading, SourceError, SourceReading
from services.collector.enrich import Enricher, Placement, load_inventory
from services.collector.events import EventDetector
from shared.contract.models import EventKind, GpuSample, Source, parse_event, parse_sample
from shared.plumbing.errors import ConfigError
from tests.helpers.collector import FakeProducer, FakeSource, make_collector, value

T = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def reading(metrics: dict[str, Any], *, at: datetime = T, uuids: tuple[str, ...] = (UUID,)) -> SourceReading:
    gpus = [
        GpuReading(
            uuid=u,
            index=i,
            model="NVIDIA H100 80GB HBM3",
            hostname="node-7",
            time=at,
            metrics=dict(metrics),
        )
        for i, u in enumerate(uuids)
    ]
    return SourceReading(
        source=Source.MOCK, target="http://n7:9400/metrics", gpus=gpus, read_at=at, latency_ms=4.2
    )


def enricher(**kwargs: Any) -> Enricher:
    return Enricher(
        collector_id="c-1",
        local_hostname="here",
        placement=Placement(cluster="prod", datacenter="dc1"),
        **kwargs,
    )


def test_inventory_places_hosts_and_wins_over_configuration(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.csv"
    inv.write_text("hostname,rack,datacenter\nnode-7,r12,dc2\nnode-8,r13,\n")
    e = enricher(inventory=load_inventory(inv))
    r = reading({"gpu_temp_c": 55})
    sample = e.sample(r.gpus[0], r)
    assert sample is not None
    assert (sample.cluster, sample.datacenter, sample.rack, sample.hostname) == (
        "prod",
        "dc2",
        "r12",
        "node-7",
    )
    assert (sample.collector_id, sample.collection_latency_ms, sample.time) == ("c-1", 4.2, T)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rack,datacenter\nr1,dc1\n", "must include 'hostname'"),
        ("hostname,rack,colour\nn1,r1,red\n", "unknown columns"),
        ("hostname,rack\nn1,r1\nn1,r2\n", "listed twice"),
        ("hostname,rack\n,r1\n", "empty hostname"),
        ("", "must include 'hostname'"),
    ],
)
def test_malformed_inventories_are_refused(tmp_path: Path, text: str, message: str) -> None:
    inv = tmp_path / "inventory.csv"
    inv.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_inventory(inv)
    with pytest.raises(ConfigError, match="No such file"):
        load_inventory(tmp_path / "missing.csv")


def test_an_invalid_metric_becomes_null_and_the_rest_survives() -> None:
    dropped: list[str] = []
    e = enricher(on_invalid=dropped.append)
    r = reading({"gpu_temp_c": -400, "power_usage_w": 300.5, "gpu_util_pct": 250, "pcie_replay_total": 7.0})
    sample = e.sample(r.gpus[0], r)
    assert sample is not None
    assert (sample.gpu_temp_c, sample.gpu_util_pct) == (None, None)
    assert (sample.power_usage_w, sample.pcie_replay_total) == (300.5, 7)
    assert sorted(dropped) == ["gpu_temp_c", "gpu_util_pct"]


def test_an_invalid_identity_drops_the_sample_and_counts_it() -> None:
    dropped: list[str] = []
    r = reading({})
    r.gpus[0].uuid = "not-a-gpu-uuid"
    assert enricher(on_invalid=dropped.append).sample(r.gpus[0], r) is None
    assert dropped == ["identity"]


def samples(metrics: dict[str, Any], at: datetime, uuids: tuple[str, ...] = (UUID,)) -> list[GpuSample]:
    r = reading(metrics, at=at, uuids=uuids)
    return [s for s in (enricher().sample(g, r) for g in r.gpus) if s]


def test_events_between_polls() -> None:
    d = EventDetector(collector_id="c-1")
    target, src = "http://n7:9400/metrics", Source.MOCK
    healthy = {
        "xid_last": 0,
        "ecc_dbe_volatile_total": 0,
        "clocks_event_reasons": 1,
        "row_remap_failure": 0,
    }
    assert d.observe(target, src, samples(healthy, T), T) == []  # first sight: baseline only
    t1 = T + timedelta(seconds=10)
    faulty = {
        "xid_last": 79,
        "ecc_dbe_volatile_total": 2,
        "clocks_event_reasons": 0x40 | 0x20,
        "row_remap_failure": 1,
    }
    kinds = {e.kind: e for e in d.observe(target, src, samples(faulty, t1), t1)}
    assert set(kinds) == {
        EventKind.XID,
        EventKind.ECC_DBE,
        EventKind.ROW_REMAP_FAILURE,
        EventKind.THROTTLE_START,
    }
    assert kinds[EventKind.XID].details == {"xid": 79}
    assert kinds[EventKind.ECC_DBE].details == {"increment": 2, "total": 2}
    assert kinds[EventKind.THROTTLE_START].details == {
        "reasons": ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    }
    assert (
        d.observe(target, src, samples(faulty, t1 + timedelta(seconds=10)), t1) == []
    )  # no change, no event
    t3 = T + timedelta(seconds=40)
    (end,) = d.observe(target, src, samples({**faulty, "clocks_event_reasons": 1}, t3), t3)
    assert end.kind is EventKind.THROTTLE_END
    assert end.details["duration_s"] == 30.0
    for event in kinds.values():  # every event is a valid contract message
        assert parse_event(event.model_dump_json()) == event


def test_gpu_lost_and_back_only_on_successful_reads() -> None:
    d = EventDetector(collector_id="c-1")
    other = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    target, src = "http://n7:9400/metrics", Source.MOCK
    d.observe(target, src, samples({}, T, (UUID, other)), T)
    t1 = T + timedelta(seconds=10)
    (lost,) = d.observe(target, src, samples({}, t1), t1)
    assert (lost.kind, lost.gpu_uuid, lost.time) == (EventKind.GPU_LOST, other, t1)
    assert d.observe(target, src, samples({}, t1), t1) == []  # lost once, not every poll
    t2 = T + timedelta(seconds=20)
    (back,) = d.observe(target, src, samples({}, t2, (UUID, other)), t2)
    assert (back.kind, back.gpu_uuid) == (EventKind.GPU_BACK, other)


def test_poll_publishes_samples_keyed_by_uuid_and_survives_source_errors() -> None:
    two = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    source = FakeSource(
        [
            reading({"gpu_temp_c": 50}, uuids=two),
            SourceError("exporter down"),
            reading({}, uuids=two),
        ]
    )
    producer = FakeProducer()
    collector, metrics = make_collector(source, producer)
    assert collector.poll_once() == (2, 0)
    assert collector.poll_once() == (0, 0)  # the error is counted, the loop goes on
    assert collector.poll_once() == (2, 0)
    assert [(t, k) for t, k, _ in producer.messages] == [("gpu-metrics-raw", u) for u in two * 2]
    assert all(parse_sample(json.dumps(v)).gpu_uuid == k for _, k, v in producer.messages)
    assert value(metrics, "source_errors", target=FakeSource.target) == 1


def test_a_full_queue_drops_counts_and_keeps_polling() -> None:
    uuids = tuple(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8))
    source = FakeSource([reading({}, uuids=uuids), reading({}, uuids=uuids)])
    producer = FakeProducer(capacity=10)
    collector, metrics = make_collector(source, producer)
    assert collector.poll_once() == (8, 0)
    assert collector.poll_once() == (2, 0)
    assert value(metrics, "dropped") == 6


class FakeTime:
    """A monotonic clock and a stop event that advance together; polls cost `cost` seconds."""

    def __init__(self, cost: float) -> None:
        self.now, self.cost = 0.0, cost
        self.poll_times: list[float] = []


def test_polls_keep_a_fixed_schedule_and_skip_missed_ticks() -> None:
    clock = FakeTime(cost=0)
    costs = iter([3.0, 3.0, 25.0, 3.0, 3.0])

    class Source(FakeSource):
        def read(self) -> SourceReading:
            clock.poll_times.append(clock.now)
            clock.now += next(costs)
            return reading({})

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock.now += timeout or 0
            if len(clock.poll_times) >= 5:
                self.set()
            return self.is_set()

    collector, metrics = make_collector(Source([]), FakeProducer(), monotonic=lambda: clock.now)
    collector.run(Stop())
    # ticks at 0, 10, 20 (overran to 45: ticks 30 and 40 skipped), 50, 60
    assert clock.poll_times == [0, 10, 20, 50, 60]
    assert value(metrics, "overruns") == 2


def test_a_gpu_back_from_the_bus_reports_its_xid_again_even_if_unchanged() -> None:
    # Issue 16: on repeated falls off the bus, dcgm-exporter's last XID stays 79 across the
    # loss, so only the first XID 79 was ever published. A GPU that returns was
    # re-initialised: its last XID on the first sample back is a new occurrence.
    d = EventDetector(collector_id="c-1")
    target, src = "http://n7:9400/metrics", Source.MOCK
    xids = []
    for k in range(3):
        t = T + timedelta(minutes=10 * k)
        d.observe(target, src, samples({"xid_last": 79 if k else 0}, t), t)
        t_lost = t + timedelta(minutes=2)
        (lost,) = d.observe(target, src, [], t_lost)
        assert lost.kind is EventKind.GPU_LOST
        t_back = t + timedelta(minutes=4)
        events = d.observe(target, src, samples({"xid_last": 79}, t_back), t_back)
        assert [e.kind for e in events] == [EventKind.GPU_BACK, EventKind.XID]
        xids += [e for e in events if e.kind is EventKind.XID]
        # while it stays, the unchanged XID is not announced again
        t_stay = t_back + timedelta(minutes=1)
        assert d.observe(target, src, samples({"xid_last": 79}, t_stay), t_stay) == []
    assert len(xids) == 3

"""The collector against a running mock fleet and the real broker."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from services.collector.build import build_collector
from services.collector.dcgm_source import DcgmSource
from services.collector.metrics import CollectorMetrics
from services.collector.poller import Collector
from services.collector.publisher import Publisher, collector_producer
from services.collector.settings import CollectorSection
from services.mock_dcgm.fleet import Fleet
from services.mock_dcgm.server import MockServer
from shared.contract.models import EventKind, Source, parse_event, parse_sample
from shared.plumbing.kafka import JsonProducer
from shared.settings.common import KafkaSettings, TopicSettings
from tests.helpers.kafka import consume_all
from tests.helpers.mock_fleet import served_fleet
from tests.helpers.topics import isolated_topics
from tests.paths import REPO


@pytest.fixture
def fleet() -> Iterator[tuple[Fleet, MockServer]]:
    with served_fleet(nodes=2, gpus=4, seed=11) as served:
        yield served


@pytest.fixture
def collector(
    fleet: tuple[Fleet, MockServer],
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
) -> Iterator[tuple[Collector, Publisher, TopicSettings]]:
    _, server = fleet
    topics = isolated_topics(topic_factory)
    collector = build_collector(
        CollectorSection(collector_id="itest", cluster="c1", interval_s=1),
        topics,
        producer=JsonProducer(collector_producer(kafka_settings, 100_000)),
        metrics=CollectorMetrics(CollectorRegistry()),
        sources=[DcgmSource(server.node_url(i), kind=Source.MOCK) for i in range(2)],
        local_hostname="itest",
    )
    publisher = collector.publisher
    yield collector, publisher, topics
    for source in collector.sources:
        source.close()


def test_every_gpu_arrives_keyed_by_uuid_in_the_contract(
    fleet: tuple[Fleet, MockServer], collector: tuple[Collector, Publisher, TopicSettings],
    kafka_settings: KafkaSettings,
) -> None:  # fmt: skip
    mock, _ = fleet
    poller, publisher, topics = collector
    for _ in range(3):
        poller.poll_once()
    assert publisher.flush(30) == 0
    messages = consume_all(kafka_settings, topics.metrics_raw, expected=24)
    assert len(messages) == 24
    expected = {g.uuid: (n.hostname, g.model.name) for n in mock.nodes for g in n.gpus}
    seen: dict[str, int] = {}
    for msg in messages:
        sample = parse_sample(msg.value() or b"")
        assert msg.key() == sample.gpu_uuid.encode()
        assert (sample.hostname, sample.model) == expected[sample.gpu_uuid]
        assert (sample.source, sample.cluster, sample.collector_id) == (Source.MOCK, "c1", "itest")
        assert sample.gpu_temp_c is not None
        seen[sample.gpu_uuid] = seen.get(sample.gpu_uuid, 0) + 1
    assert seen == dict.fromkeys(expected, 3)


def test_an_injected_xid_and_a_gpu_off_the_bus_become_events(
    fleet: tuple[Fleet, MockServer], collector: tuple[Collector, Publisher, TopicSettings],
    kafka_settings: KafkaSettings,
) -> None:  # fmt: skip
    mock, _ = fleet
    poller, publisher, topics = collector
    xid_gpu, lost_gpu = mock.nodes[0].gpus[1].uuid, mock.nodes[1].gpus[3].uuid
    poller.poll_once()
    mock.inject({"kind": "xid", "gpu_uuid": xid_gpu, "params": {"code": 94}})
    fault = mock.inject({"kind": "fall_off_bus", "gpu_uuid": lost_gpu, "params": {"scrape_delay_s": 0.2}})
    poller.poll_once()
    mock.clear(fault.id)
    poller.poll_once()
    assert publisher.flush(30) == 0
    events = [parse_event(m.value() or b"") for m in consume_all(kafka_settings, topics.events, expected=4)]
    assert [(e.kind, e.gpu_uuid) for e in events if e.gpu_uuid == xid_gpu] == [(EventKind.XID, xid_gpu)]
    assert next(e for e in events if e.gpu_uuid == xid_gpu).details == {"xid": 94}
    # Back on the bus, the GPU reports XID 79 (fallen off the bus) as its last XID.
    assert [(e.kind, e.details.get("xid")) for e in events if e.gpu_uuid == lost_gpu] == [
        (EventKind.GPU_LOST, None),
        (EventKind.GPU_BACK, None),
        (EventKind.XID, 79),
    ]


@pytest.mark.local_stack
def test_a_20s_broker_outage_loses_no_sample(
    collector: tuple[Collector, Publisher, TopicSettings], kafka_settings: KafkaSettings
) -> None:
    poller, publisher, topics = collector
    services = [str(REPO / "scripts" / "services.sh")]
    polls = 0
    pause = threading.Event()
    subprocess.run([*services, "stop", "kafka"], check=True, capture_output=True)
    try:
        outage_ends = time.monotonic() + 20
        while time.monotonic() < outage_ends:
            assert poller.poll_once() == (8, 0)  # polling goes on: nothing blocks, nothing dropped
            polls += 1
            pause.wait(1)
    finally:
        subprocess.run([*services, "start", "kafka"], check=True, capture_output=True)
    poller.poll_once()
    polls += 1
    assert publisher.flush(120) == 0
    messages = consume_all(kafka_settings, topics.metrics_raw, expected=polls * 8, timeout_s=60)
    keys = {(m.key(), parse_sample(m.value() or b"").time) for m in messages}
    assert len(messages) == polls * 8
    assert len(keys) == polls * 8  # no duplicates either: the producer is idempotent
    assert polls >= 15


def test_the_mock_nodes_kernel_log_is_read_as_make_up_reads_it(
    fleet: tuple[Fleet, MockServer], kafka_settings: KafkaSettings, topic_factory: Callable[..., str],
) -> None:  # fmt: skip
    """KERNEL_LOG=mock (deploy/local-stack.toml): the line's own message reaches the event, and the
    exporter's gauge seeing the same XID adds no second one."""
    mock, server = fleet
    topics = isolated_topics(topic_factory)
    cfg = CollectorSection(collector_id="itest-k", cluster="c1", interval_s=1, kernel_log="mock",
                           dcgm_urls=[server.node_url(0)], source="mock")  # fmt: skip
    producer = JsonProducer(collector_producer(kafka_settings, 100_000))
    metrics = CollectorMetrics(CollectorRegistry())
    poller = build_collector(cfg, topics, producer=producer, metrics=metrics, local_hostname="itest-k")
    try:
        gpu = mock.nodes[0].gpus[2].uuid
        poller.poll_once()
        mock.inject({"kind": "xid", "gpu_uuid": gpu, "params": {"code": 149, "row": 1}})
        deadline = time.monotonic() + 30
        while poller.poll_once()[1] == 0 and time.monotonic() < deadline:
            pass
        for _ in range(3):  # the gauge's sight of it, a poll or more later
            poller.poll_once()
        assert poller.publisher.flush(30) == 0
        events = [
            parse_event(m.value() or b"") for m in consume_all(kafka_settings, topics.events, expected=1)
        ]
        (xid,) = [e for e in events if e.gpu_uuid == gpu and e.kind is EventKind.XID]
        assert (xid.details["xid"], xid.details["origin"]) == (149, "journal")
        assert "Link" in str(xid.details["kernel_message"])
    finally:
        poller.close()

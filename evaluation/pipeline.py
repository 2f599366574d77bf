"""The whole pipeline in one test process: mock fleet -> collector -> Kafka -> sink -> TimescaleDB.

The fleet runs on a hand-moved clock, so a test can live through hours of
simulated time in seconds; every sample carries its simulated timestamp, and
the scorer judges as of the newest one, as it does for a replayed fleet.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from services.collector.dcgm_source import DcgmSource
from services.collector.enrich import Enricher, Placement
from services.collector.events import EventDetector
from services.collector.metrics import CollectorMetrics
from services.collector.poller import Collector
from services.collector.publisher import Publisher, collector_producer
from services.mock_dcgm.fleet import Fleet, FleetSpec, SimClock
from services.mock_dcgm.server import MockServer
from services.scorer.cycle import CycleResult, run_cycle
from services.scorer.rules_config import load_rules
from services.sink.loop import SinkLoop
from services.sink.metrics import SinkMetrics
from services.sink.writer import BatchWriter
from shared.config import DatabaseSettings, KafkaSettings, TopicSettings
from shared.db import connect
from shared.kafka import JsonProducer, make_consumer, make_producer
from shared.store import offsets


def make_loop(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str, **kw: Any
) -> SinkLoop:
    """A sink loop with quick retries, as the tests and evaluations want it."""
    return SinkLoop(
        consumer=make_consumer(kafka, group_id=group),
        dlq_producer=make_producer(kafka),
        writer=BatchWriter(db, group=group),
        topics=topics,
        metrics=SinkMetrics(CollectorRegistry()),
        max_backoff_s=2.0,
        **kw,
    )


def stored_offsets_total(db: DatabaseSettings, group: str) -> int:
    """The next offsets `group` stored, summed over its partitions: the messages it has done."""
    with connect(db) as conn:
        return offsets.stored_sum(conn, group)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        pause.wait(0.2)


class HandClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Pipeline:
    def __init__(self, kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings,
                 *, nodes: int, gpus: int, hours_back: float) -> None:  # fmt: skip
        self.hand = HandClock()
        self.fleet = Fleet(
            FleetSpec(nodes=nodes, gpus_per_node=gpus, seed=17),
            SimClock(start_s=time.time() - hours_back * 3600, monotonic=self.hand),
        )
        self.server = MockServer(self.fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=True)
        self.db, self.topics = db, topics
        metrics = CollectorMetrics(CollectorRegistry())
        self.publisher = Publisher(JsonProducer(collector_producer(kafka, 100_000)), metrics)
        self.collector = Collector(
            # The mock's servers bind their ports when built, so their URLs are known now.
            sources=[DcgmSource(self.server.node_url(i)) for i in range(nodes)],
            enricher=Enricher(
                collector_id="itest", local_hostname="itest", placement=Placement(cluster="c1")
            ),
            detector=EventDetector(collector_id="itest"),
            publisher=self.publisher,
            topics=topics,
            metrics=metrics,
            interval_s=60,
        )
        self.sink: SinkLoop = make_loop(kafka, db, topics, f"pipe-{uuid.uuid4().hex[:8]}", batch_size=2000)
        self.rules = load_rules()

    def gpu(self, node: int, index: int) -> str:
        return self.fleet.nodes[node].gpus[index].uuid

    def inject(self, **request: Any) -> int:
        return self.fleet.inject(request).id

    def run(self, sim_seconds: float, step_s: float = 120) -> None:
        """Advance the simulated clock, polling every node at each step."""
        for _ in range(int(sim_seconds // step_s)):
            self.hand.t += step_s
            self.collector.poll_once()

    def settle(self) -> None:
        """Wait until the sink has stored everything the collector published."""
        assert self.publisher.flush(60) == 0
        produced = self.publisher.delivered
        wait_until(lambda: stored_offsets_total(self.db, self.sink.writer.group) >= produced, 90, "the sink")

    def score(self) -> CycleResult:
        """Score as of the newest sample, as the scorer does for a replayed or simulated fleet."""
        self.settle()
        with connect(self.db) as conn:
            row = conn.execute("SELECT max(time) FROM gpu_latest").fetchone()
            assert row is not None, "nothing ingested"
            assert isinstance(row[0], datetime), "nothing ingested"
            as_of = row[0]
            return run_cycle(conn, as_of, self.rules, None)

    def verdicts(self) -> dict[tuple[str, str], tuple[str, str | None]]:
        with connect(self.db) as conn:
            rows = conn.execute("SELECT gpu_uuid, subsystem, state, rule FROM gpu_health_current").fetchall()
        return {(str(u), str(s)): (str(st), None if r is None else str(r)) for u, s, st, r in rows}

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with connect(self.db) as conn:
            return conn.execute(sql, params).fetchall()


@contextmanager
def pipeline(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, **kw: Any
) -> Iterator[Pipeline]:
    p = Pipeline(kafka, db, topics, **kw)
    p.server.start()
    thread = threading.Thread(target=p.sink.run, daemon=True)
    thread.start()
    try:
        yield p
    finally:
        p.sink.stop.set()
        thread.join(60)
        p.sink.consumer.close()
        p.sink.writer.close()
        for s in p.collector.sources:
            s.close()
        p.server.stop()

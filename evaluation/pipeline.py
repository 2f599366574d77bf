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
from contextlib import ExitStack, contextmanager
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from services.collector.build import build_collector
from services.collector.dcgm_source import DcgmSource
from services.collector.metrics import CollectorMetrics
from services.collector.poller import Collector
from services.collector.publisher import collector_producer
from services.collector.settings import CollectorSection
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from services.scorer.cycle import CycleResult, run_cycle
from services.scorer.rules_config import load_rules
from services.sink.build import build_sink_loop, sink_loop_closed
from services.sink.loop import SinkLoop
from services.sink.metrics import SinkMetrics
from services.sink.settings import SinkSection
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer
from shared.plumbing.running import running
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from shared.store import fleet, health, offsets, rollup


def make_loop(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, group: str, **kw: Any
) -> SinkLoop:
    """A sink loop with quick retries, as the tests and evaluations want it (`kw`: SinkSection's fields)."""
    unknown = set(kw) - set(SinkSection.model_fields)
    if unknown:  # SinkSection ignores fields it does not have: a typo would be dropped silently
        raise TypeError(f"make_loop: not SinkSection fields: {sorted(unknown)}")
    cfg = SinkSection(group_id=group, max_backoff_s=2.0, **kw)
    return build_sink_loop(kafka, db, topics, cfg, metrics=SinkMetrics(CollectorRegistry()))


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
        self.collector: Collector = build_collector(
            CollectorSection(collector_id="itest", cluster="c1", interval_s=60),
            topics,
            producer=JsonProducer(collector_producer(kafka, 100_000)),
            metrics=CollectorMetrics(CollectorRegistry()),
            # The mock's servers bind their ports when built, so their URLs are known now.
            sources=[DcgmSource(self.server.node_url(i)) for i in range(nodes)],
            local_hostname="itest",
        )
        self.publisher = self.collector.publisher
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
        """Wait until the sink has stored everything the collector published, and its rollup
        refresh has recomputed every minute those batches noted (the scorer reads settled minutes
        only: scoring before the refresh would judge the newest minutes as missing)."""
        assert self.publisher.flush(60) == 0
        produced = self.publisher.delivered
        wait_until(lambda: stored_offsets_total(self.db, self.sink.writer.group) >= produced, 90, "the sink")
        wait_until(lambda: not self.rollup_behind(), 90, "the sink's rollup refresh")

    def rollup_behind(self) -> bool:
        with connect(self.db) as conn:
            return rollup.behind(conn)

    def score(self) -> CycleResult:
        """Score as of the newest sample, as the scorer does for a replayed or simulated fleet."""
        self.settle()
        with connect(self.db) as conn:
            as_of = fleet.newest_sample_time(conn)
            assert isinstance(as_of, datetime), "nothing ingested"
            return run_cycle(conn, as_of, self.rules, None)

    def verdicts(self) -> dict[tuple[str, str], tuple[str, str | None]]:
        with connect(self.db) as conn:
            rows = health.current_verdicts(conn)
        return {(uuid, sub): (state, rule) for uuid, sub, state, rule in rows}

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with connect(self.db) as conn:
            return conn.execute(sql, params).fetchall()


@contextmanager
def pipeline(
    kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, **kw: Any
) -> Iterator[Pipeline]:
    """The pipeline running (the sink on a thread); everything closed in reverse, however the block ends."""
    p = Pipeline(kafka, db, topics, **kw)
    with ExitStack() as stack:
        stack.enter_context(p.server)
        stack.enter_context(p.collector)
        stack.enter_context(sink_loop_closed(p.sink))
        p.server.start()
        stack.enter_context(running(p.sink, name="pipeline-sink"))
        yield p

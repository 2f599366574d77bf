"""A simulated fleet fed straight into the database: the pipeline minus Kafka, for long runs.

The mock renders each node's exposition, the collector's own parser, enricher
and event detector turn it into samples and events, and the sink's own batch
writer stores them in one transaction per poll (and the rollup is refreshed after each). Only the
Kafka hop is left out, so 72 simulated hours of a 32-GPU fleet take a minute
or two instead of an hour; the Kafka path is covered by evaluation/pipeline.py
and the integration tests, which run the same scenarios on it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from gpuhealth.gpu.readings import GpuReading, MetricValue, SourceReading
from services.collector.dcgm_source import parse_exposition
from services.collector.enrich import Enricher, Placement, reading_time
from services.collector.events import EventDetector
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.simulation import NodeSim
from services.scorer.cycle import CycleResult, run_cycle
from services.scorer.predict import Prediction
from services.scorer.rules_config import Rules
from services.sink.metrics import SinkMetrics
from services.sink.rollup import RollupRefresher
from services.sink.rows import sample_row
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import Source
from shared.gpu.dcgm import FIELDS, ValueKind
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

from .pipeline import HandClock


def node_readings(node: NodeSim, *, driver_version: str, at: datetime) -> list[GpuReading]:
    """What parse_exposition makes of the node's rendered page, without rendering and parsing it.

    The exposition's parser is ~90% of a simulated poll; tests pin this to the parsed page
    (same fields, same values, unsupported ones None) so the shortcut cannot drift.
    """
    out = []
    for gpu in node.gpus:
        if not gpu.present:
            continue
        values = gpu.values()
        metrics: dict[str, MetricValue] = {}
        for f in FIELDS:
            value = values.get(f.sample_field)
            if value is None or f.name in gpu.model.unsupported:
                metrics[f.sample_field] = None
            else:
                metrics[f.sample_field] = int(value) if f.kind is ValueKind.INT64 else float(f"{value:f}")
        job = gpu.job
        out.append(GpuReading(
            uuid=gpu.uuid, index=gpu.index, model=gpu.model.name, pci_bus_id=gpu.pci_bus_id,
            driver_version=driver_version, hostname=node.hostname, time=at, metrics=metrics,
            workload={"pod": job.pod, "namespace": job.namespace, "container": job.container} if job else {},
        ))  # fmt: skip
    return out


class SimFeed:
    """A fleet on a hand-moved clock, polled into the database every `poll_s` simulated seconds."""

    def __init__(
        self, db: DatabaseSettings, spec: FleetSpec, *, start_s: float, rules: Rules, exposition: bool = False
    ) -> None:
        self.exposition = exposition  # render and parse each page (slow) instead of node_readings
        self.hand = HandClock()
        self.fleet = Fleet(spec, SimClock(start_s=start_s, monotonic=self.hand))
        self.db, self.rules = db, rules
        self.enricher = Enricher(
            collector_id="eval", local_hostname="eval", placement=Placement(cluster="sim")
        )
        self.detector = EventDetector(collector_id="eval")
        self.writer = BatchWriter(db, group="eval-feed", connections=1)
        # the sink refreshes the rollup after its batches; here each write is followed by its refresh,
        # and the simulated past is never too old to be recomputed
        self.rollup = RollupRefresher(db, SinkMetrics(CollectorRegistry()), keep_raw=timedelta(days=3650))
        self.urls = [f"mock://{n.hostname}" for n in self.fleet.nodes]
        self.next_poll_t: float | None = None
        self.last_poll_s: float | None = None
        self.predictions: dict[str, Prediction] = {}

    @property
    def now_s(self) -> float:
        return self.fleet.clock.now()

    def poll(self, batch: Batch | None = None) -> None:
        """One poll of every node, into `batch`, or written as a batch of its own."""
        own = batch is None
        batch = Batch() if batch is None else batch
        for i, url in enumerate(self.urls):
            at = datetime.fromtimestamp(int(self.now_s * 1000) / 1000, UTC)
            if self.exposition:
                text, _delay = self.fleet.scrape(i, timestamps=True)
                gpus = parse_exposition(text, scraped_at=at)
            else:
                node = self.fleet.nodes[i]
                with node.lock:
                    node.advance(self.now_s)
                    gpus = node_readings(node, driver_version=self.fleet.spec.driver_version, at=at)
            reading = SourceReading(source=Source.MOCK, target=url, gpus=gpus, read_at=at, latency_ms=1.0)
            samples = [s for s in (self.enricher.sample(g, reading) for g in reading.gpus) if s]
            batch.rows.extend(sample_row(s) for s in samples)
            batch.events.extend(self.detector.observe(url, reading.source, samples, reading_time(reading)))
        if own:
            self.store(batch)

    def advance(self, seconds: float, poll_s: float) -> None:
        """Move the clock by exactly `seconds`, polling on the fixed poll_s grid on the way (so
        polls and scoring cycles need not line up); the polls go to the database together."""
        batch = Batch()
        end = self.hand.t + seconds
        if self.next_poll_t is None:
            self.next_poll_t = self.hand.t + poll_s
        while self.next_poll_t <= end:
            self.hand.t = self.next_poll_t
            self.poll(batch)
            self.last_poll_s = self.now_s
            self.next_poll_t += poll_s
        self.hand.t = end
        if batch.rows or batch.events:
            self.store(batch)

    def store(self, batch: Batch) -> None:
        """Write one batch as the sink does, then refresh the rollup minutes it noted."""
        self.writer.write(batch)
        if not self.rollup.refresh():
            raise RuntimeError("the rollup refresh failed (see the log)")

    def score(self, *, predict: bool) -> CycleResult:
        """One scoring cycle as of the newest poll, as the scorer's `latest` mode judges a simulated
        fleet (predictions only when asked: they are hourly)."""
        as_of = datetime.fromtimestamp(self.last_poll_s or self.now_s, UTC)
        with connect(self.db) as conn:
            # between predictions the scorer keeps its last ones, as services/scorer/loop.py does
            result = run_cycle(conn, as_of, self.rules, None if predict else self.predictions)
        self.predictions = result.predictions
        return result

    def close(self) -> None:
        self.writer.close()
        self.rollup.close()


@contextmanager
def sim_feed(
    db: DatabaseSettings, spec: FleetSpec, *, hours: float, rules: Rules, exposition: bool = False
) -> Iterator[SimFeed]:
    """A feed whose simulated clock starts `hours` before now, so the whole run lies in the past.

    The start is rounded to a whole minute plus 17.5 s, so polls never sit on the rollup's
    minute boundaries and faults scheduled at odd seconds fall between polls."""
    start = (int(time.time() - hours * 3600 - 3600) // 60) * 60 + 17.5
    feed = SimFeed(db, spec, start_s=start, rules=rules, exposition=exposition)
    try:
        yield feed
    finally:
        feed.close()

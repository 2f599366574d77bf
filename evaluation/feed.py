"""A simulated fleet fed straight into the database: the pipeline minus Kafka, for long runs.

The mock renders each node's exposition, the collector's own parser, enricher
and event detector turn it into samples and events, and the sink's own batch
writer stores them (with the rollup) in one transaction per poll. Only the
Kafka hop is left out, so 72 simulated hours of a 32-GPU fleet take a minute
or two instead of an hour; the Kafka path is covered by evaluation/pipeline.py
and the integration tests, which run the same scenarios on it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from services.collector.dcgm_source import parse_exposition
from services.collector.enrich import Enricher, Placement, reading_time
from services.collector.events import EventDetector
from services.collector.readings import SourceReading
from services.mock_dcgm.fleet import Fleet, FleetSpec, SimClock
from services.scorer.cycle import CycleResult, run_cycle
from services.scorer.rules_config import Rules
from services.sink.rows import sample_row
from services.sink.writer import Batch, BatchWriter
from shared.config import DatabaseSettings
from shared.db import connect
from shared.models import Source


class _HandClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class SimFeed:
    """A fleet on a hand-moved clock, polled into the database every `poll_s` simulated seconds."""

    def __init__(self, db: DatabaseSettings, spec: FleetSpec, *, start_s: float, rules: Rules) -> None:
        self.hand = _HandClock()
        self.fleet = Fleet(spec, SimClock(start_s=start_s, monotonic=self.hand))
        self.db, self.rules = db, rules
        self.enricher = Enricher(collector_id="eval", local_hostname="eval", placement=Placement(cluster="sim"))
        self.detector = EventDetector(collector_id="eval")
        self.writer = BatchWriter(db, group="eval-feed", connections=1)
        self.urls = [f"mock://{n.hostname}" for n in self.fleet.nodes]

    @property
    def now_s(self) -> float:
        return self.fleet.clock.now()

    def poll(self) -> None:
        """One poll of every node, written as one batch."""
        batch = Batch()
        for i, url in enumerate(self.urls):
            text, _delay = self.fleet.scrape(i, timestamps=True)
            at = datetime.fromtimestamp(self.now_s, UTC)
            reading = SourceReading(
                source=Source.MOCK, target=url, gpus=parse_exposition(text, scraped_at=at), read_at=at, latency_ms=1.0
            )
            samples = [s for s in (self.enricher.sample(g, reading) for g in reading.gpus) if s]
            batch.rows.extend(sample_row(s) for s in samples)
            batch.events.extend(self.detector.observe(url, reading.source, samples, reading_time(reading)))
        self.writer.write(batch)

    def advance(self, seconds: float, poll_s: float) -> None:
        for _ in range(int(round(seconds / poll_s))):
            self.hand.t += poll_s
            self.poll()

    def score(self, *, predict: bool) -> CycleResult:
        """One scoring cycle as of now (predictions only when asked: they are hourly)."""
        as_of = datetime.fromtimestamp(self.now_s, UTC)
        with connect(self.db) as conn:
            return run_cycle(conn, as_of, self.rules, None if predict else {})

    def close(self) -> None:
        self.writer.close()


@contextmanager
def sim_feed(db: DatabaseSettings, spec: FleetSpec, *, hours: float, rules: Rules) -> Iterator[SimFeed]:
    """A feed whose simulated clock starts `hours` before now, so the whole run lies in the past."""
    feed = SimFeed(db, spec, start_s=time.time() - hours * 3600 - 3600, rules=rules)
    try:
        yield feed
    finally:
        feed.close()

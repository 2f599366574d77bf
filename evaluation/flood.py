"""A flood through the whole pipeline: the mock's kernel log, the collector, Kafka, the sink, TimescaleDB.

One GPU of a two-node mock fleet logs `lines` lines of one XID over `over_s`
seconds; meanwhile other GPUs log one ordinary XID each, spread over the same
time. The collector (its real sources and journal feeds, polling every
`poll_s`, folding repeats within `fold_s`) publishes to the real broker, the
real sink stores into a migrated schema, and a watcher notes when each other
GPU's XID first shows in gpu_events. The same run without the flood is the
baseline of those latencies (bench/bench_flood.py; the integration test
tests/integration/test_flood.py asserts the exact totals).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from services.collector.build import build_collector
from services.collector.dcgm_source import DcgmSource
from services.collector.kernel_log import JournalFeed, mock_journal
from services.collector.metrics import CollectorMetrics
from services.collector.publisher import collector_producer
from services.collector.settings import CollectorSection
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.server import MockServer
from services.sink.build import sink_loop_closed
from shared.contract.models import Source
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_admin
from shared.plumbing.migrate import migrated_schema
from shared.plumbing.running import running
from shared.plumbing.topic_admin import TopicSpec, ensure_topics
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from shared.store import events

from .pipeline import make_loop, wait_until

FLOODED = (0, 0)  # node, GPU
FLOOD_XID = 95
# Other GPUs' ordinary XIDs: (node, GPU, code), spread over the flood's time.
OTHERS = ((1, 1, 48), (0, 2, 13), (1, 3, 31), (0, 3, 94), (1, 0, 79), (0, 1, 62))
LEAD_S = 2.0  # the first XID this long after the pipeline is up


@dataclass(slots=True)
class FloodFigures:
    lines_in: int  # lines the flooded GPU's kernel log holds
    xid_events_published: int  # gpu-events messages the collector queued for XIDs, every GPU's
    flood_rows: int  # gpu_events rows of the flooded GPU's XID
    flood_counted: int  # the lines those rows count
    other_rows: int  # gpu_events XID rows of the other GPUs
    # per other GPU's XID: from the line's time to its row in gpu_events, seconds
    other_latency_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def run_flood(
    kafka: KafkaSettings,
    db: DatabaseSettings,
    topics: TopicSettings,
    *,
    lines: int,
    over_s: float = 50.0,
    poll_s: float = 1.0,
    fold_s: float = 10.0,
    group: str = "flood",
) -> FloodFigures:
    """One run (`lines` 0: no flood, the baseline); the figures once every line is stored or counted."""
    started = time.monotonic()
    fleet = Fleet(FleetSpec(nodes=2, gpus_per_node=4, seed=23), SimClock(start_s=time.time()))
    with MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False) as server:
        server.start()
        urls = [server.node_url(i) for i in range(len(fleet.nodes))]
        metrics = CollectorMetrics(CollectorRegistry())
        collector = build_collector(
            CollectorSection(collector_id=group, interval_s=poll_s, xid_fold_s=fold_s),
            topics,
            producer=JsonProducer(collector_producer(kafka, 1_000_000)),
            metrics=metrics,
            sources=[DcgmSource(url, kind=Source.MOCK) for url in urls],
            xid_feeds=[JournalFeed(mock_journal(url), hosts=True, from_start=True) for url in urls],
            local_hostname="flood-collector",
        )
        loop = make_loop(kafka, db, topics, group)
        stop = threading.Event()
        poller = threading.Thread(target=collector.run, args=(stop,), name="flood-collector")
        with collector, sink_loop_closed(loop), running(loop, name="flood-sink"):
            poller.start()
            begin = fleet.clock.now() - fleet.clock.start_s + LEAD_S
            flooded = fleet.nodes[FLOODED[0]].gpus[FLOODED[1]].uuid
            if lines:
                fleet.inject({"kind": "xid", "node": FLOODED[0], "gpu": FLOODED[1], "after_s": begin,
                              "params": {"code": FLOOD_XID, "lines": lines, "over_s": over_s}})  # fmt: skip
            written: dict[tuple[str, int], float] = {}
            for n, (node, gpu, code) in enumerate(OTHERS):
                at = begin + over_s * (n + 0.5) / len(OTHERS)
                fleet.inject(
                    {"kind": "xid", "node": node, "gpu": gpu, "after_s": at, "params": {"code": code}}
                )
                written[(fleet.nodes[node].gpus[gpu].uuid, code)] = fleet.clock.start_s + at
            seen: dict[tuple[str, int], float] = {}
            watcher = threading.Thread(
                target=_watch, args=(db, flooded, seen, written, stop), name="flood-watch"
            )
            watcher.start()
            try:
                wait_until(
                    lambda: len(seen) == len(written), over_s + 60, "the other GPUs' XIDs in gpu_events"
                )
                if lines:
                    wait_until(
                        lambda: _counted(db, flooded)[1] >= lines, over_s + fold_s + 120, "every line counted"
                    )
            finally:
                stop.set()
                poller.join(30)
                watcher.join(30)
        rows, counted = _counted(db, flooded)
        with connect(db) as conn:
            other_rows = len(events.xids_elsewhere(conn, flooded))
        log = fleet.kernel_logs[FLOODED[0]]
        lines_in = sum(1 for r in log.records if f"): {FLOOD_XID}, " in r.message)
        published = sum(
            s.value for m in metrics.events.collect() for s in m.samples
            if s.name.endswith("_total") and s.labels.get("kind") == "xid"
        )  # fmt: skip
    return FloodFigures(
        lines_in=lines_in, xid_events_published=int(published), flood_rows=rows, flood_counted=counted,
        other_rows=int(other_rows), other_latency_s=[seen[k] - written[k] for k in sorted(written)],
        wall_s=time.monotonic() - started,
    )  # fmt: skip


@contextmanager
def flood_topics(kafka: KafkaSettings) -> Iterator[TopicSettings]:
    """Throwaway topics for one run: samples (4 partitions), events (2) and dead letters; deleted after."""
    admin = make_admin(kafka)
    names = {field: f"flood-{field.replace('_', '-')}-{uuid.uuid4().hex[:10]}"
             for field in ("metrics_raw", "events", "dead_letters")}  # fmt: skip
    parts = {"metrics_raw": 4, "events": 2, "dead_letters": 1}
    ensure_topics(
        admin, [TopicSpec(name=n, partitions=parts[f], replication_factor=1) for f, n in names.items()]
    )
    try:
        yield TopicSettings(**names)
    finally:
        for done in admin.delete_topics(list(names.values())).values():
            done.result()


def evaluate_floods(kafka: KafkaSettings, db: DatabaseSettings, *, lines: int = 100_000) -> str:
    """`make evaluate`'s flood figures: one flood, its lines counted in its rows, the other GPUs' XIDs."""
    with migrated_schema(db, "eval_flood") as scoped, flood_topics(kafka) as topics:
        f = run_flood(kafka, scoped, topics, lines=lines, group="eval-flood")
    exact = "exact" if f.flood_counted == f.lines_in else f"OFF BY {f.flood_counted - f.lines_in:+,}"
    return "\n".join([
        "Floods (evaluation/flood.py: the mock's kernel log, the collector, Kafka, the sink, TimescaleDB)",
        f"  {f.lines_in:,} lines of XID {FLOOD_XID} on one GPU: {f.flood_rows} rows counting"
        f" {f.flood_counted:,} lines ({exact}); {f.xid_events_published} XID events published in all",
        f"  other GPUs' XIDs meanwhile: {f.other_rows} of {len(OTHERS)} stored, line to row at most"
        f" {max(f.other_latency_s):.2f} s",
    ])  # fmt: skip


def _counted(db: DatabaseSettings, gpu_uuid: str) -> tuple[int, int]:
    """The flooded GPU's rows of the flood's XID, and the lines they count."""
    with connect(db) as conn:
        return events.xid_lines(conn, gpu_uuid, FLOOD_XID)


def _watch(
    db: DatabaseSettings,
    flooded: str,
    seen: dict[tuple[str, int], float],
    written: dict[tuple[str, int], float],
    stop: threading.Event,
) -> None:
    """Note the wall time each other GPU's XID first shows in gpu_events."""
    with connect(db, autocommit=True) as conn:
        while not stop.is_set() and len(seen) < len(written):
            for gpu, code in events.xids_elsewhere(conn, flooded):
                seen.setdefault((gpu, code), time.time())
            stop.wait(0.1)

"""The whole pipeline under a simulated fleet: the sink, N scorers and the API as processes, faults injected.

A fleet of `--gpus` GPUs reports every 10 s (100,000 GPUs: 10,000 samples/s),
produced straight to Kafka in the collector's format (every field of the
contract, as the collector encodes it) by a process of its own. Every topic of
the registry gets a name unique to the run, and a scratch schema gets the
project's migrations. The real services run as processes: the sink
(`--sinks`), the scorers (`--scorers`, one consumer group sharing the fleet by
partition) and the API. Hard faults (XID 79, the GPU fell off the bus) arrive
on gpu-events at random GPUs and times (`--faults` a minute). After
`--minutes`, it reports, each figure beside its same-run baseline:

- the sink's lag over time (messages produced and not yet stored, and the
  seconds of fleet they are), against a raw binary COPY of the same rows;
- each scorer's cycle time against its interval and against its SQL alone
  (the selection and the feature reads of as many GPUs as it judged, run by
  the bench as the cycle ran);
- the API's p50/p99 for the fleet summary and the GPU list, against the same
  SQL through psycopg, interleaved;
- the fast path: from the event's arrival in Kafka (the broker's append time)
  to the alert received from gpu-alerts and to the alert listed by the API,
  p50/p99, against a bare consumer's receive time of the same events;
- the CPU the machine spent per 1,000 GPUs, by party.

`--double` runs again at twice the fleet, and again, until something gives (the
load generator falls behind, the sink's lag passes 30 s or grows, a cycle
overruns its interval, a fault gets no alert), and says what gave at which
fleet size. The latency targets (the fast path's p99 within 1 s, the
summary's within 100 ms) are reported as met or missed at every size. The machine is shared:
its load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka
import httpx

from bench._common import bench_callers, report
from bench.cpu import MACHINE, CpuMeter
from gpuhealth.contract.wire_time import wire_time
from gpuhealth.kafka import encode_json
from services.api.app import reader_settings
from services.api.settings import ApiSection, missing_after_s
from services.scorer.event_path import SLOW_BATCH_S
from services.scorer.features import read_features
from services.scorer.rules_config import load_rules
from services.sink.rows import METRIC_COLUMNS, stage_row
from shared.contract.models import SCHEMA_VERSION, parse_sample, to_json
from shared.fakes.samples import gpu_uuid, sample
from shared.plumbing.db import connect
from shared.plumbing.kafka import make_admin, make_consumer, make_producer, wait_for_kafka
from shared.plumbing.migrate import migrated_schema
from shared.plumbing.topic_admin import TopicSpec, ensure_topics, project_topics
from shared.settings.common import DatabaseSettings, KafkaSettings, Settings, TopicSettings
from shared.store import fleet, judging, offsets, samples

REPO = Path(__file__).resolve().parents[1]
CADENCE_S = 10.0
SLOT_S = 0.1  # the feed produces a tenth of a second's share of the fleet at a time
PORT = 18310  # the API's (the bench's port range)
SERVERS = {"PostgreSQL": "postgres", "Kafka": "java"}
TEMPLATES = 1000  # distinct metric values; GPU g reports template g % TEMPLATES
COPY_ROWS = 50_000
GPUS_PER_HOST, HOSTS_PER_RACK = 8, 32
# What must hold for the fleet size to count as carried (the targets).
SINK_LAG_S, FAST_PATH_P99_S, SUMMARY_P99_MS = 30.0, 1.0, 100.0


# --- the fleet (its own process) -----------------------------------------------------------------


def templates() -> list[tuple[list[bytes], list[int]]]:
    """Each template's JSON (as the collector encodes a sample) cut around its time (0), UUID (1), host (2)
    and rack (3): the pieces, and which value goes between each two."""
    out = []
    for i in range(TEMPLATES):
        message = to_json(parse_sample(json.dumps(sample(i, TEMPLATES))))
        message.update(time="@@0@@", gpu_uuid="@@1@@", hostname="@@2@@", rack="@@3@@")
        pieces = re.split(rb"@@([0-3])@@", encode_json(message))
        out.append((pieces[0::2], [int(piece) for piece in pieces[1::2]]))
    return out


def render(template: tuple[list[bytes], list[int]], stamp: bytes, uuid_: bytes, g: int) -> bytes:
    """GPU g's sample at `stamp` (a wire time): its template with its time, UUID, host and rack."""
    pieces, order = template
    values = (
        stamp,
        uuid_,
        b"node-%d" % (g // GPUS_PER_HOST),
        b"r%d" % (g // (GPUS_PER_HOST * HOSTS_PER_RACK)),
    )
    parts = [pieces[0]]
    for slot, piece in zip(order, pieces[1:], strict=True):
        parts += (values[slot], piece)
    return b"".join(parts)


def feed(
    kafka: KafkaSettings,
    topic: str,
    gpus: int,
    seconds: float,
    produced: Synchronized[int],
    behind: Synchronized[float],
    began: Synchronized[float],
) -> None:
    """Every GPU's sample once per CADENCE_S, a slot at a time, for `seconds`; `behind`: the most a slot
    started late (the generator falling behind its own schedule)."""
    shapes = templates()
    uuids = [gpu_uuid(g).encode() for g in range(gpus)]
    producer = make_producer(kafka)
    per_slot = gpus * SLOT_S / CADENCE_S
    start = time.monotonic()
    began.value = time.time()
    slot, owed, g = 0, 0.0, 0
    while (due := start + slot * SLOT_S) < start + seconds:
        late = time.monotonic() - due
        if late < 0:
            time.sleep(-late)
        else:
            behind.value = max(behind.value, late)
        stamp = wire_time(datetime.now(UTC)).encode()
        owed += per_slot
        count = int(owed)
        owed -= count
        for _ in range(count):
            value = render(shapes[g % TEMPLATES], stamp, uuids[g], g)
            while True:
                try:
                    producer.produce(topic, value, key=uuids[g])
                    break
                except BufferError:  # the local queue is full: the broker is behind
                    producer.poll(0.05)
            g = (g + 1) % gpus
        producer.poll(0)
        with produced.get_lock():
            produced.value += count
        slot += 1
    producer.flush(60)


# --- the services -------------------------------------------------------------------------------


@dataclass
class Run:
    """One run's settings: the fleet, the services, and where everything goes."""

    gpus: int
    minutes: float
    scorers: int
    sinks: int
    interval_s: float
    faults_per_min: float
    partitions: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def topics(self) -> TopicSettings:
        names = {r.setting: f"{r.default}-bench-{self.tag}" for r in TopicSettings.registry()}
        hour = 3_600_000  # the run's topics are deleted afterwards; kept short meanwhile
        return TopicSettings(**names, partitions=self.partitions, retention_ms=hour, audit_retention_ms=hour)

    def env(self, kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "GPUHEALTH_DB__HOST": db.host,
            "GPUHEALTH_DB__PORT": str(db.port),
            "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
            "GPUHEALTH_TOPICS__PARTITIONS": str(self.partitions),
            "GPUHEALTH_SINK__GROUP_ID": f"sink-{self.tag}",
            "GPUHEALTH_SINK__METRICS_PORT": "0",
            "GPUHEALTH_SCORER__GROUP": f"scorer-{self.tag}",
            "GPUHEALTH_SCORER__METRICS_PORT": "0",
            "GPUHEALTH_SCORER__INTERVAL_S": str(self.interval_s),
            "GPUHEALTH_API__PORT": str(PORT),
            "GPUHEALTH_LOG__LEVEL": "INFO",
            **bench_callers().env,
        }
        for r in TopicSettings.registry():
            env[f"GPUHEALTH_TOPICS__{r.setting.upper()}"] = getattr(topics, r.setting)
        return env


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextmanager
def services(run: Run, env: dict[str, str], logs: Path) -> Iterator[list[Service]]:
    """The sinks, the scorers and the API, as processes; SIGTERM'd at the end (each must exit 0)."""
    started: list[Service] = []
    wanted = [("sink", "services.sink")] * run.sinks + [("scorer", "services.scorer")] * run.scorers
    try:
        for i, (name, module) in enumerate([*wanted, ("api", "services.api")]):
            path = logs / f"{name}-{i}.log"
            with path.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", module], cwd=REPO, env=env, stdout=out, stderr=out
                )
            started.append(Service(name, proc, path))
        yield started
    finally:
        for s in started:
            s.proc.send_signal(signal.SIGTERM)
        for s in started:
            try:
                code = s.proc.wait(60)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                code = s.proc.wait()
            if code != 0:
                print(f"  ! {s.name} (pid {s.proc.pid}) exited {code}: {s.log}")


def log_lines(path: Path, message: str) -> list[dict[str, Any]]:
    """The JSON log lines of `path` whose message is `message`."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") == message:
                out.append(entry)
    return out


# --- what the bench watches ---------------------------------------------------------------------


@dataclass
class Watch:
    """Everything measured during a run, filled by the watchers' threads."""

    lag: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the run, messages behind)
    faults: dict[str, float] = field(default_factory=dict)  # GPU -> the event's append time (epoch s)
    bare: dict[str, float] = field(default_factory=dict)  # GPU -> a bare consumer's receive time
    alerted: dict[str, float] = field(default_factory=dict)  # GPU -> its alert received from gpu-alerts
    listed: dict[str, float] = field(default_factory=dict)  # GPU -> its alert first listed by the API
    api: dict[str, list[float]] = field(default_factory=dict)  # what -> seconds
    cycle_sql: list[tuple[int, float]] = field(default_factory=list)  # (GPUs, its SQL alone s)
    stop: threading.Event = field(default_factory=threading.Event)


def consume_times(
    kafka: KafkaSettings,
    topic: str,
    into: dict[str, float],
    ready: threading.Event,
    stop: threading.Event,
    wanted: Callable[[dict[str, Any]], bool],
) -> None:
    """Note when each GPU's first wanted message on `topic` is received (a bare consumer, its own group)."""
    consumer = make_consumer(
        kafka,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        overrides={"auto.offset.reset": "earliest", "fetch.wait.max.ms": 10},
    )
    consumer.subscribe([topic], on_assign=lambda *_: ready.set())
    try:
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            now = time.time()
            value = json.loads(msg.value() or b"{}")
            gpu = value.get("gpu_uuid")
            if gpu and gpu not in into and wanted(value):
                into[gpu] = now
    finally:
        consumer.close()


def opened(w: Watch) -> Callable[[dict[str, Any]], bool]:
    """An alert opened for one of the injected faults' GPUs."""
    return lambda v: v.get("state") == "open" and v.get("gpu_uuid") in w.faults


def inject_faults(
    kafka: KafkaSettings, topic: str, gpus: int, per_min: float, until: float, w: Watch
) -> None:
    """XID 79 at random GPUs and random times (a Poisson process), each GPU once; noted at its append time."""
    producer = make_producer(kafka)
    rng = random.Random()

    def delivered(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
        key = msg.key()
        if err is None and key:
            w.faults[key.decode()] = msg.timestamp()[1] / 1000  # the broker's LogAppendTime

    while not w.stop.wait(rng.expovariate(per_min / 60)) and time.monotonic() < until:
        g = rng.randrange(gpus)
        uid = gpu_uuid(g)
        if uid in w.faults or len(w.faults) >= gpus:  # each GPU fails once: its first alert is this fault's
            continue
        event = {
            "schema_version": SCHEMA_VERSION,
            "time": wire_time(datetime.now(UTC)),
            "kind": "xid",
            "gpu_uuid": uid,
            "hostname": f"node-{g // GPUS_PER_HOST}",
            "source": "mock",
            "collector_id": "bench-fleet",
            "details": {"xid": 79},
        }
        producer.produce(topic, encode_json(event), key=uid.encode(), on_delivery=delivered)
        producer.poll(0)
        producer.flush(10)
    producer.flush(10)


def watch_api_alerts(w: Watch) -> None:
    """Ask the API for each fault's open alert until it is listed."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{PORT}", timeout=10, headers=bench_callers().headers()
    ) as http:
        while not w.stop.wait(0.05):
            for gpu in [g for g in list(w.faults) if g not in w.listed]:
                try:
                    found = http.get("/api/v1/alerts", params={"gpu": gpu, "state": "open"}).json()
                except httpx.HTTPError:
                    continue
                if found.get("alerts"):
                    w.listed[gpu] = time.time()


def probe_api(db: DatabaseSettings, w: Watch) -> None:
    """The summary and the GPU list through the API, each beside its own SQL through psycopg, interleaved."""
    api = ApiSection()
    missing = missing_after_s(api.rules_file)
    direct: dict[str, Callable[[Any], object]] = {
        "summary": lambda conn: fleet.summary_sync(conn, missing_after_s=missing),
        "gpus": lambda conn: fleet.gpu_page_sync(conn, fleet.GpuFilters(), sort="score", limit=100, offset=0),
    }
    paths: dict[str, tuple[str, dict[str, str | int]]] = {
        "summary": ("/api/v1/fleet/summary", {}),
        "gpus": ("/api/v1/gpus", {"sort": "score", "limit": 100}),
    }
    with (
        httpx.Client(
            base_url=f"http://127.0.0.1:{PORT}", timeout=30, headers=bench_callers().headers()
        ) as http,
        connect(reader_settings(db, api), autocommit=True) as conn,
    ):
        while not w.stop.wait(0.5):
            for what, (path, params) in paths.items():
                t = time.perf_counter()
                try:
                    http.get(path, params=params).raise_for_status()
                except httpx.HTTPError:
                    continue
                w.api.setdefault(f"{what} API", []).append(time.perf_counter() - t)
                t = time.perf_counter()
                direct[what](conn)
                w.api.setdefault(f"{what} SQL", []).append(time.perf_counter() - t)


def sample_lag(db: DatabaseSettings, group: str, produced: Synchronized[int], w: Watch, t0: float) -> None:
    with connect(db, autocommit=True) as conn:
        while not w.stop.wait(5):
            stored = offsets.stored_sum(conn, group) - len(w.faults)  # the sink stores gpu-events too
            w.lag.append((time.monotonic() - t0, max(0, produced.value - stored)))


def replay_cycle_sql(db: DatabaseSettings, scorer_logs: list[Path], partitions: int, w: Watch) -> None:
    """For each scorer cycle logged, its SQL alone: the selection over its share, and the feature reads
    of as many of the share's GPUs as it judged, as of now (the bench's own connection)."""
    from shared.plumbing.kafka import key_partition

    rules = load_rules()
    seen = [0] * len(scorer_logs)
    with connect(db) as conn:
        while not w.stop.wait(2):
            for i, path in enumerate(scorer_logs):
                cycles = [c for c in log_lines(path, "cycle") if int(c.get("share", 0))]
                if len(cycles) <= max(seen[i], 1):  # each scorer's first cycle judges its whole share
                    seen[i] = len(cycles)
                    continue
                seen[i] = len(cycles)
                last = cycles[-1]
                held = set(last.get("partitions") or [])
                share = [g for g in judging.inventory_gpus(conn) if key_partition(g, partitions) in held]
                at = datetime.now(UTC)
                started = time.perf_counter()
                judging.needing_judgement(
                    conn,
                    at,
                    share,
                    missing_after_s=rules.availability.missing_after_s,
                    late_s=300,
                    every_s=60,
                )
                read_features(conn, at, rules, share[: int(last.get("gpus", 0))])
                w.cycle_sql.append((int(last.get("gpus", 0)), time.perf_counter() - started))
                conn.rollback()


# --- one run ------------------------------------------------------------------------------------


def copy_rate(db: DatabaseSettings) -> float:
    """Rows/s of one binary COPY of COPY_ROWS collector rows straight into gpu_metrics."""
    rows = [
        stage_row(json.dumps(to_json(parse_sample(json.dumps(sample(i, TEMPLATES))))))[: len(METRIC_COLUMNS)]
        for i in range(COPY_ROWS)
    ]
    with connect(db) as conn, conn.cursor() as cur:
        started = time.perf_counter()
        samples.copy_straight(cur, rows, staging_rows=False)
        conn.commit()
        return COPY_ROWS / (time.perf_counter() - started)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else float("nan")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_run(run: Run, settings: Settings) -> list[str]:
    """Run the fleet for run.minutes and print its figures; what gave (empty: it carried the load)."""
    kafka = settings.kafka
    topics = run.topics()
    admin = make_admin(kafka)
    specs = project_topics(topics)
    specs = [
        TopicSpec(
            s.name,
            s.partitions,
            s.replication_factor,
            {**s.config, "message.timestamp.type": "LogAppendTime"} if s.name == topics.events else s.config,
        )
        for s in specs
    ]
    print(
        f"== {run.gpus:,} GPUs every {CADENCE_S:.0f} s ({run.gpus / CADENCE_S:,.0f} samples/s) for"
        f" {run.minutes:g} min: {run.sinks} sink(s), {run.scorers} scorer(s) every {run.interval_s:g} s,"
        f" the API; {run.partitions} partitions; load average at start {loadavg()}",
        flush=True,
    )
    with ExitStack() as stack:
        ensure_topics(admin, specs)
        stack.callback(lambda: [f.result() for f in admin.delete_topics([s.name for s in specs]).values()])
        with migrated_schema(settings.db, "bench") as scratch:
            copy = copy_rate(scratch)
        db = stack.enter_context(migrated_schema(settings.db, "bench"))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        env = run.env(kafka, db, topics)
        procs = stack.enter_context(services(run, env, logs))
        scorer_logs = [s.log for s in procs if s.name == "scorer"]
        deadline = time.monotonic() + 120
        while sum(bool(log_lines(p, "assigned")) for p in scorer_logs) < min(run.scorers, run.partitions):
            if time.monotonic() > deadline or any(s.proc.poll() is not None for s in procs):
                tails = "\n".join(f"{s.name}: {s.log.read_text()[-1500:]}" for s in procs)
                raise RuntimeError(f"the services did not start:\n{tails}")
            time.sleep(0.5)
        w = Watch()
        ready = [threading.Event(), threading.Event()]
        ctx = multiprocessing.get_context("spawn")
        produced: Synchronized[int] = ctx.Value("q", 0)
        behind: Synchronized[float] = ctx.Value("d", 0.0)
        began: Synchronized[float] = ctx.Value("d", 0.0)
        seconds = run.minutes * 60
        feeder = ctx.Process(
            target=feed, args=(kafka, topics.metrics_raw, run.gpus, seconds, produced, behind, began)
        )
        threads = [
            threading.Thread(
                target=consume_times, args=(kafka, topics.events, w.bare, ready[0], w.stop, lambda v: True)
            ),
            threading.Thread(
                target=consume_times, args=(kafka, topics.alerts, w.alerted, ready[1], w.stop, opened(w))
            ),
        ]
        for t in threads:
            t.start()
        for r in ready:
            r.wait(60)
        feeder.start()
        while not began.value and feeder.is_alive():
            time.sleep(0.05)
        t0 = time.monotonic()
        meter = CpuMeter(
            pids={
                "sink": lambda: [s.proc.pid for s in procs if s.name == "sink"],
                "scorers": lambda: [s.proc.pid for s in procs if s.name == "scorer"],
                "API": lambda: [s.proc.pid for s in procs if s.name == "api"],
                "fleet feed": lambda: [feeder.pid] if feeder.pid else [],
                "bench (watchers)": lambda: [os.getpid()],
            },
            names=SERVERS,
        )
        meter.start()
        more = [
            threading.Thread(target=sample_lag, args=(db, f"sink-{run.tag}", produced, w, t0)),
            threading.Thread(target=probe_api, args=(db, w)),
            threading.Thread(target=watch_api_alerts, args=(w,)),
            threading.Thread(target=replay_cycle_sql, args=(db, scorer_logs, run.partitions, w)),
        ]
        for t in more:
            t.start()
        time.sleep(min(30.0, seconds / 4))  # the first cycles judge every GPU: faults start after them
        more.append(
            threading.Thread(
                target=inject_faults,
                args=(kafka, topics.events, run.gpus, run.faults_per_min, t0 + seconds - 10, w),
            )
        )
        more[-1].start()
        time.sleep(max(0.0, t0 + seconds - 1 - time.monotonic()))  # the feed's last second: it is still there
        wall, used, rate = time.monotonic() - t0, meter.stop(), produced.value / (time.time() - began.value)
        feeder.join(120)
        time.sleep(5)  # the last faults' alerts
        w.stop.set()
        for t in [*threads, *more]:
            t.join(30)
        load = loadavg()
        # the cycles once the fleet reported (the ones before judged an empty inventory)
        cycles = [[c for c in log_lines(p, "cycle") if int(c.get("share", 0))] for p in scorer_logs]
        slow = [b for p in scorer_logs for b in log_lines(p, "slow event batch")]
    return summarise(run, w, cycles, slow, used, wall, copy, rate, behind.value, load)


def summarise(
    run: Run,
    w: Watch,
    cycles: list[list[dict[str, Any]]],
    slow: list[dict[str, Any]],
    used: dict[str, float],
    wall: float,
    copy: float,
    achieved: float,
    behind: float,
    load: str,
) -> list[str]:
    gave: list[str] = []  # the pipeline stopped keeping up with the fleet
    missed: list[str] = []  # it kept up, but a latency target was missed
    rate = run.gpus / CADENCE_S
    print(f"  load average at the end: {load} (1, 5, 15 min; 2 cores shared with other tenants)")
    report("fleet feed, samples/s produced", achieved, "samples/s", "the fleet's cadence", rate)
    if achieved < 0.95 * rate or behind > CADENCE_S:
        gave.append(f"the load generator (one process) fell behind: {achieved:,.0f} of {rate:,.0f} samples/s")
    # the sink
    lags = [(t, n / rate) for t, n in w.lag]
    if lags:
        tail = lags[len(lags) // 2 :] or lags
        series = ", ".join(f"{t:.0f}s:{s:.1f}" for t, s in lags[:: max(1, len(lags) // 12)])
        print(f"  sink lag over time (seconds into the run: seconds of fleet behind): {series}")
        worst, end = max(s for _, s in lags), lags[-1][1]
        report("sink lag, worst", worst, "s", "target", SINK_LAG_S)
        # the lag's trend over the run's second half (its least-squares slope): a sink that keeps up
        # holds it flat, one that does not adds to it every second
        slope = (
            statistics.linear_regression([t for t, _ in tail], [s for _, s in tail]).slope
            if len(tail) > 1
            else 0.0
        )
        growing = slope > 0.01 and end > CADENCE_S
        print(
            f"  sink lag at the end {end:.1f} s; {'GROWING' if growing else 'bounded'}"
            f" (over the second half it moved {slope * 60:+.1f} s a minute)"
        )
        span = max(1.0, w.lag[-1][0] - w.lag[0][0])
        stored = achieved - (w.lag[-1][1] - w.lag[0][1]) / span  # what came in, less what the lag grew by
        report("sink, rows stored /s over the run", stored, "rows/s", "raw binary COPY (same run)", copy)
        report("the fleet's rate", rate, "rows/s", "raw binary COPY (same run)", copy)
        if worst > SINK_LAG_S or growing:
            gave.append(f"the sink: lag {worst:.0f} s at worst, {'growing' if growing else 'bounded'}")
    # the scorers
    for i, mine in enumerate(cycles):
        steady = [float(c["seconds"]) for c in mine[1:]]
        if mine:
            judged = statistics.mean(int(c["gpus"]) for c in mine[1:]) if steady else 0
            print(
                f"  scorer {i}: first cycle {float(mine[0]['seconds']):.1f} s over its"
                f" {mine[0].get('share', 0):,} GPUs; then {len(steady)} cycles, {judged:,.0f} GPUs each"
            )
        if steady:
            report(f"scorer {i} cycle, max", max(steady), "s", "its interval", run.interval_s)
            report(f"scorer {i} cycle, mean", statistics.mean(steady), "s", "its interval", run.interval_s)
            if max(steady) > run.interval_s:
                gave.append(
                    f"scorer {i}: a cycle took {max(steady):.1f} s, over its {run.interval_s:g} s interval"
                )
        elif mine and float(mine[0]["seconds"]) > run.interval_s:
            gave.append(
                f"scorer {i}: its first cycle took {float(mine[0]['seconds']):.0f} s and no other ended"
            )
        elif not mine:
            gave.append(f"scorer {i}: no cycle over the fleet ended within the run")
    steady_all = [(int(c["gpus"]), float(c["seconds"])) for mine in cycles for c in mine[1:]]
    if steady_all and w.cycle_sql:
        per_gpu = sum(s for _, s in steady_all) / max(1, sum(n for n, _ in steady_all))
        sql_per_gpu = sum(s for _, s in w.cycle_sql) / max(1, sum(n for n, _ in w.cycle_sql))
        report(
            "scorer cycles, seconds per GPU judged (ms)",
            per_gpu * 1000,
            "ms",
            "their SQL alone",
            sql_per_gpu * 1000,
        )
    # the API
    for what, label in (("summary", "fleet summary"), ("gpus", "GPU list (100 by score)")):
        api, sql = w.api.get(f"{what} API", []), w.api.get(f"{what} SQL", [])
        if api and sql:
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                report(
                    f"API {label} {name} ({len(api)} requests)",
                    pct(api, q) * 1000,
                    "ms",
                    f"its SQL alone {name}",
                    pct(sql, q) * 1000,
                )
            if what == "summary" and pct(api, 0.99) * 1000 > SUMMARY_P99_MS:
                missed.append(f"the API: summary p99 {pct(api, 0.99) * 1000:.0f} ms")
    # the fast path
    arrived = {g: t for g, t in w.faults.items()}
    bare = [w.bare[g] - t for g, t in arrived.items() if g in w.bare]
    alert = [w.alerted[g] - t for g, t in arrived.items() if g in w.alerted]
    listed = [w.listed[g] - t for g, t in arrived.items() if g in w.listed]
    print(
        f"  fast path, event in Kafka -> alert on gpu-alerts, each (s): {sorted(round(a, 2) for a in alert)}"
    )
    print(
        f"  faults injected: {len(arrived)}; alerts on gpu-alerts {len(alert)},"
        f" listed by the API {len(listed)}"
    )
    if slow:  # where the slow batches' time went, by stage (services/scorer/event_path.py)
        stages = sorted(k for k in slow[0] if k.endswith("_s") and k != "oldest_s")
        spent = ", ".join(f"{k[:-2]} max {max(float(b[k]) for b in slow):.2f} s" for k in stages)
        print(f"  event batches over {SLOW_BATCH_S:g} s: {len(slow)}; {spent}")
    if bare and alert:
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            report(
                f"event in Kafka -> alert on gpu-alerts, {name}",
                pct(alert, q),
                "s",
                f"bare consumer {name}",
                pct(bare, q),
            )
            if listed:
                report(
                    f"event in Kafka -> alert listed by the API, {name}",
                    pct(listed, q),
                    "s",
                    f"bare consumer {name}",
                    pct(bare, q),
                )
        if pct(alert, 0.99) > FAST_PATH_P99_S:
            missed.append(f"the fast path: p99 {pct(alert, 0.99):.2f} s")
        if len(alert) < len(arrived):
            gave.append(f"the fast path: {len(arrived) - len(alert)} of {len(arrived)} faults had no alert")
    # the CPU
    kgpus = run.gpus / 1000
    ours = sum(v for k, v in used.items() if k != MACHINE)
    parts = ", ".join(
        f"{k} {v / wall / kgpus * 1000:.1f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])
    )
    print(f"  CPU per 1,000 GPUs (millicores, over {wall:.0f} s): {parts}")
    report(
        "CPU per 1,000 GPUs, the pipeline's parties (millicores)",
        ours / wall / kgpus * 1000,
        "mcores",
        "whole machine, every tenant",
        used.get(MACHINE, 0) / wall / kgpus * 1000,
    )
    print(f"  {'GAVE: ' + '; '.join(gave) if gave else 'kept up with the fleet'}", flush=True)
    if missed:
        print(f"  targets missed: {'; '.join(missed)}", flush=True)
    return gave


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=2000, help="fleet size (default 2,000)")
    parser.add_argument(
        "--minutes", type=float, default=2.0, help="how long the fleet runs (default 2: a smoke run)"
    )
    parser.add_argument("--scorers", type=int, default=3, help="scorer processes (default 3)")
    parser.add_argument("--sinks", type=int, default=2, help="sink processes (default 2)")
    parser.add_argument("--interval", type=float, default=30.0, help="the scorers' interval_s (default 30)")
    parser.add_argument("--faults", type=float, default=6.0, help="hard faults a minute (default 6)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of every topic (default 6)")
    parser.add_argument(
        "--double", action="store_true", help="double the fleet after each run until one gives"
    )
    args = parser.parse_args()
    if args.gpus < 1 or args.minutes <= 0 or args.scorers < 1 or args.sinks < 1:
        parser.error("--gpus, --minutes, --scorers and --sinks must be positive")
    settings = Settings()
    wait_for_kafka(settings.kafka)
    gpus = args.gpus
    while True:
        run = Run(
            gpus=gpus,
            minutes=args.minutes,
            scorers=args.scorers,
            sinks=args.sinks,
            interval_s=args.interval,
            faults_per_min=args.faults,
            partitions=args.partitions,
        )
        gave = one_run(run, settings)
        if not args.double:
            return 0
        if gave:
            print(f"== doubling: at {gpus:,} GPUs, what gave: {'; '.join(gave)}")
            return 0
        gpus *= 2


if __name__ == "__main__":
    sys.exit(main())

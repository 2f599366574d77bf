"""Sink throughput from a pre-filled topic, next to a raw binary COPY of the same rows.

Everything writes the same samples into a fresh `gpu_metrics` hypertable (each
run in its own schema with the project's migrations). The samples are messages
as the collector publishes them: every field of the contract, nulls included
(~1.7 kB each). The sink is the real
service, `python -m services.sink`, run as one process, then as two and as three
in one consumer group (the way it scales out; on this machine's two cores a third
process overlaps one's Python with the others' database work). Its figure covers
consume + decode/validate + the straight COPY into gpu_metrics + gpu_latest,
gpu_assets and the rollup's notes + offsets, one transaction per batch, and
the 1-minute rollup's refresh after the batches: the clock stops when the last
offset is stored AND every noted minute is refreshed (end to end).

"Pre-filled" without timing a group join or a rebalance: the sinks start on
their empty topic and settle (every partition assigned to the expected number
of members); then all samples are produced in ONE Kafka transaction. The sinks
read committed messages only, so the whole topic appears at the commit, which
starts the clock; it stops when the last offset is stored in the database and
the rollup has caught up with it.
The baseline is psycopg's binary COPY of the already-built rows straight into
the hypertable over one connection: no Kafka, no validation, no idempotency.
Target: ratio >= 0.6.

`--against DIR` also runs the sink of another checkout (the previous release,
say, in a git worktree: `git worktree add DIR <commit>`) in the same rounds,
each sink contender beside its twin from DIR, so the two meet the same noise.

It also prints where the CPU went, per row and by party (the sink's processes,
PostgreSQL, Kafka, the whole machine), and the rate the machine's cores could
reach at that cost if every one of them were busy all the time: every party
shares the same cores, so the sink cannot beat that ceiling on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from bench._common import report, scratch_topic
from bench.cpu import MACHINE, CpuMeter
from services.sink.rows import METRIC_COLUMNS, stage_row
from shared.contract.models import parse_sample, to_json
from shared.fakes.samples import sample
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_admin, make_producer, wait_for_kafka
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings, KafkaSettings, Settings
from shared.store import offsets, rollup, samples

REPO = Path(__file__).resolve().parents[1]
N, GPUS, PARTITIONS = 200_000, 1000, 6
SERVERS = {"PostgreSQL": "postgres", "Kafka": "java"}  # the servers' processes, by name
RUNS = 4  # of each contender, interleaved; reported as best and as median
BASELINE = "raw binary COPY"


def group_settled(admin: AdminClient, group: str, members: int) -> bool:
    """The group is stable with `members` members that own every partition between them.

    Not yet, either, while the broker cannot describe it (a fresh broker's coordinator still loading).
    """
    try:
        description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    except KafkaException as e:
        if e.args and isinstance(e.args[0], KafkaError) and e.args[0].retriable():
            return False
        raise
    owned = sum(len(m.assignment.topic_partitions) for m in description.members)
    return (
        str(description.state).endswith("STABLE")
        and len(description.members) == members
        and (owned == PARTITIONS)
    )


class Run(NamedTuple):
    rate: float  # rows/s
    cpu: dict[str, float]  # CPU µs per row, by party (bench.cpu)


def sink_rate(
    kafka: KafkaSettings, db: DatabaseSettings, topic: str, processes: int, lanes: int, tree: Path = REPO
) -> Run:
    """Rows/s of `processes` sink services (of the checkout `tree`) in one group, from a settled
    group to the last offset."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "GPUHEALTH_DB__HOST": db.host, "GPUHEALTH_DB__PORT": str(db.port),
        "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
        "GPUHEALTH_TOPICS__METRICS_RAW": topic, "GPUHEALTH_TOPICS__EVENTS": f"{topic}-events",
        "GPUHEALTH_TOPICS__DEAD_LETTERS": f"{topic}-dlq", "GPUHEALTH_SINK__GROUP_ID": group,
        "GPUHEALTH_SINK__METRICS_PORT": "0", "GPUHEALTH_SINK__LANES": str(lanes),
    }  # fmt: skip
    with tempfile.TemporaryFile() as log:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "services.sink"], cwd=tree, env=env, stdout=log, stderr=log
            )
            for _ in range(processes)
        ]
        try:
            deadline, admin = time.monotonic() + 60, make_admin(kafka)
            while not group_settled(admin, group, processes):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    log.seek(0)
                    raise RuntimeError(f"the sinks did not settle:\n{log.read().decode()[-3000:]}")
                time.sleep(0.05)
            fill_in_one_transaction(kafka, topic)
            with connect(db, autocommit=True) as watch:

                def all_stored() -> None:
                    while offsets.stored_sum(watch, group) < N or rollup.behind(watch):
                        time.sleep(0.02)

                sinks = CpuMeter(pids={"sink": lambda: [p.pid for p in procs]}, names=SERVERS)
                run = timed(sinks, all_stored)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            codes = [p.wait(60) for p in procs]
    if any(codes):
        raise RuntimeError(f"a sink did not exit cleanly on SIGTERM: {codes}")
    return run


def collector_message(i: int) -> dict[str, Any]:
    """Sample i as the collector publishes it: every field of the contract, nulls included."""
    return to_json(parse_sample(json.dumps(sample(i, GPUS))))


def fill_in_one_transaction(kafka: KafkaSettings, topic: str) -> None:
    producer = make_producer(
        kafka,
        {
            "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
            "message.timeout.ms": 120_000,
            "transaction.timeout.ms": 300_000,
        },
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    json_producer = JsonProducer(producer)  # encoded as the collector encodes them
    for i in range(N):
        message = collector_message(i)
        json_producer.produce(topic, message["gpu_uuid"], message)
    producer.commit_transaction(120)
    if json_producer.failed:
        raise RuntimeError(f"{json_producer.failed} samples were not delivered: {json_producer.last_error}")


def timed(meter: CpuMeter, work: Callable[[], object]) -> Run:
    """The rate of `work` over the N samples, and the CPU each row cost each party meanwhile."""
    meter.start()
    start = time.perf_counter()
    work()
    elapsed = time.perf_counter() - start
    used = meter.stop()
    return Run(N / elapsed, {party: seconds / N * 1e6 for party, seconds in used.items()})


def copy_rate(db: DatabaseSettings, rows: list[tuple[object, ...]]) -> Run:
    """Rows/s of one binary COPY of the already-built rows (the sink's straight COPY, alone)."""
    with connect(db) as conn, conn.cursor() as cur:

        def copy_all() -> None:
            samples.copy_straight(cur, rows, staging_rows=False)
            conn.commit()

        return timed(CpuMeter(pids={"bench (psycopg)": lambda: [os.getpid()]}, names=SERVERS), copy_all)


def one_sink_run(
    settings: Settings, processes: int, lanes: int, tree: Path = REPO
) -> Callable[[DatabaseSettings], Run]:
    def measure(db: DatabaseSettings) -> Run:
        with scratch_topic(settings.kafka, partitions=PARTITIONS) as topic:
            return sink_rate(settings.kafka, db, topic, processes, lanes, tree)

    return measure


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against", type=Path, metavar="DIR",
        help="also run the sink of this checkout (e.g. the previous release), beside each sink contender",
    )  # fmt: skip
    parser.add_argument(
        "--processes", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2, 3],
        help="sink processes of each contender, comma-separated (1: two lanes, more: one each)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=RUNS, help=f"rounds of every contender (default {RUNS})")
    args = parser.parse_args()
    settings = Settings()
    wait_for_kafka(settings.kafka)
    rows = [stage_row(json.dumps(collector_message(i)))[: len(METRIC_COLUMNS)] for i in range(N)]
    contenders: dict[str, Callable[[DatabaseSettings], Run]] = {}
    for processes in args.processes:
        lanes = 2 if processes == 1 else 1
        what = (
            "1 process (2 lanes, the default)" if processes == 1 else f"{processes} processes (1 lane each)"
        )
        contenders[f"sink, {what}"] = one_sink_run(settings, processes, lanes)
        if args.against is not None:
            contenders[f"sink of {args.against}, {what}"] = one_sink_run(
                settings, processes, lanes, args.against.resolve()
            )
    contenders[BASELINE] = partial(copy_rate, rows=rows)
    # Round-robin, so every contender meets the same spells of noise from other tenants.
    measured: dict[str, list[Run]] = {name: [] for name in contenders}
    for _ in range(args.runs):
        for name, measure in contenders.items():
            with migrated_schema(settings.db, "bench") as db:
                measured[name].append(measure(db))
            print(f"    ({name}: {measured[name][-1].rate:,.0f} rows/s)", flush=True)
    runs = {name: [r.rate for r in results] for name, results in measured.items()}
    for name, rates in runs.items():
        print(f"  {name}: runs {', '.join(f'{r:,.0f}' for r in rates)} rows/s, median {median(rates):,.0f}")
    print_cpu(measured, median(runs[BASELINE]))
    # Two estimates of the same ratio: best against best (the bench/ convention), and median
    # against median (steadier here: a 2 s COPY is likelier than a 4 s sink run to land in a
    # quiet spell of a shared host).
    for name in contenders:
        if name != BASELINE:
            what = f"{name}, samples/s ({N:,} samples, {GPUS} GPUs)"
            report(f"{what}, best", max(runs[name]), "rows/s", BASELINE, max(runs[BASELINE]))
            report(f"{what}, median", median(runs[name]), "rows/s", BASELINE, median(runs[BASELINE]))
    return 0


def print_cpu(measured: dict[str, list[Run]], baseline_rate: float) -> None:
    """Where the cycles went, and the most this machine's cores allow at that cost per row."""
    if not CpuMeter.available():
        return
    cores = os.cpu_count() or 1
    print(f"  CPU per row, median of the runs (µs; user + system, from /proc; {cores} cores):")
    for name, results in measured.items():
        parties = sorted({p for r in results for p in r.cpu}, key=lambda p: (p == MACHINE, p))
        cost = {p: median(r.cpu.get(p, 0.0) for r in results) for p in parties}
        # every party shares the cores: at this cost the machine cannot go faster than this
        ceiling = cores / cost[MACHINE] * 1e6 if cost.get(MACHINE) else float("inf")
        shares = ", ".join(f"{p} {c:.1f}" for p, c in cost.items())
        print(
            f"    {name}: {shares}; ceiling at full use of {cores} cores {ceiling:,.0f} rows/s"
            f" = {ceiling / baseline_rate:.2f} of raw COPY's median"
        )


if __name__ == "__main__":
    sys.exit(main())

"""Bytes per row in the Parquet archive next to the same rows in the hypertable, and the archive's rate.

The rows are realistic: a simulated 32-GPU fleet (services.mock_dcgm: workloads
cycling, noise, counters that grow) read the way the collector reads it
(the values the exposition carries -> enrich -> the contract), every 10 s for a few
simulated hours 40 days ago, staged as the sink stages them and copied into a
fresh `gpu_metrics` hypertable (its own schema with the project's
migrations). Then:

- hypertable bytes/row: the chunks' heap + TOAST + the (gpu_uuid, time)
  index, after VACUUM, from chunks_detailed_size(); the heap alone too;
- archive bytes/row: the Parquet files retention wrote (zstd, the default
  level), and the same table re-encoded at other zstd levels, in memory;
- archive rate: rows/s of a retention round (read, write, fsync, read back,
  drop) next to a bare binary `COPY (SELECT * FROM chunk) TO STDOUT` of the
  same rows, the least any archive must do to read them.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from bench._common import best_of, report
from gpuhealth.gpu.readings import GpuReading, SourceReading
from services.collector.enrich import Enricher, Placement
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.sink.metrics import SinkMetrics
from services.sink.retention import Retention
from services.sink.rows import METRIC_COLUMNS, STAGE_TYPES, stage_row
from shared.contract.models import Source, to_json
from shared.gpu.dcgm import FIELDS, ValueKind
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings, Settings
from shared.store.archive import chunk_relations, hypertable_bytes, load_rows_binary, read_chunks_binary
from shared.store.retention import vacuum_analyze

NODES, GPUS_PER_NODE, POLLS, INTERVAL_S = 4, 8, 1500, 10.0  # 48,000 samples, ~4 simulated hours
DAYS_AGO = 40


def node_readings(fleet: Fleet, node_index: int, t: float) -> list[GpuReading]:
    """What the collector would parse from the node's page at simulated time t, without the text.

    The exposition parser costs ~5 ms a GPU here; the values are the same ones
    the mock renders (int64 fields as integers, unsupported ones blank).
    """
    node = fleet.nodes[node_index]
    node.advance(t)
    when = datetime.fromtimestamp(t, UTC)
    readings = []
    for gpu in node.gpus:
        if not gpu.present:
            continue
        values = gpu.values()
        metrics: dict[str, int | float | None] = {}
        for field in FIELDS:
            value = values.get(field.sample_field)
            if value is None or field.name in gpu.model.unsupported:
                metrics[field.sample_field] = None
            else:
                metrics[field.sample_field] = int(value) if field.kind is ValueKind.INT64 else round(value, 6)
        job = gpu.job
        workload = {"pod": job.pod, "namespace": job.namespace, "container": job.container} if job else {}
        readings.append(
            GpuReading(uuid=gpu.uuid, index=gpu.index, model=gpu.model.name, pci_bus_id=gpu.pci_bus_id,
                       driver_version=fleet.spec.driver_version, hostname=node.hostname, time=when,
                       metrics=metrics, workload={k: v for k, v in workload.items() if v})
        )  # fmt: skip
    return readings


def fleet_rows() -> list[tuple[object, ...]]:
    """The fleet's samples as staged rows, every field as the collector fills it."""
    start = time.time() - DAYS_AGO * 86_400
    fleet = Fleet(FleetSpec(nodes=NODES, gpus_per_node=GPUS_PER_NODE, seed=3), SimClock(start_s=start))
    enricher = Enricher(
        collector_id="bench", local_hostname="bench", placement=Placement(cluster="c1", datacenter="dc1")
    )
    rows = []
    for poll in range(POLLS):
        t = start + poll * INTERVAL_S
        for node in range(NODES):
            gpus = node_readings(fleet, node, t)
            reading = SourceReading(Source.MOCK, f"node-{node}", gpus, datetime.fromtimestamp(t, UTC), 3.0)
            for gpu in gpus:
                sample = enricher.sample(gpu, reading)
                if sample is not None:
                    rows.append(stage_row(json.dumps(to_json(sample)))[: len(METRIC_COLUMNS)])
    return rows


def load(db: DatabaseSettings, rows: list[tuple[object, ...]]) -> None:
    with connect(db) as conn:
        load_rows_binary(conn, "gpu_metrics", METRIC_COLUMNS, STAGE_TYPES[: len(METRIC_COLUMNS)], rows)
        conn.commit()
    with connect(db, autocommit=True) as conn:
        vacuum_analyze(conn, "gpu_metrics")


def hypertable_sizes(db: DatabaseSettings) -> tuple[int, int]:
    """(heap + TOAST + indexes, heap only) of the hypertable's chunks."""
    with connect(db) as conn:
        return hypertable_bytes(conn, "gpu_metrics")


def copy_out_rate(db: DatabaseSettings, rows: int) -> float:
    """Rows/s of a binary COPY TO STDOUT of every chunk, the data read and thrown away."""
    with connect(db) as conn:
        chunks = chunk_relations(conn, "gpu_metrics")

        def read_all() -> None:
            read_chunks_binary(conn, chunks)
            conn.rollback()

        return rows / best_of(3, read_all)


def reencoded_bytes(table: pa.Table, level: int) -> int:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=level)
    return int(sink.getvalue().size)


def main() -> int:
    settings = Settings()
    rows = fleet_rows()
    n = len(rows)
    print(f"{n:,} samples from a simulated {NODES * GPUS_PER_NODE}-GPU fleet, every {INTERVAL_S:g} s")
    with migrated_schema(settings.db, "bench_archive") as db, tempfile.TemporaryDirectory() as tmp:
        load(db, rows)
        total, heap = hypertable_sizes(db)
        copy_rate = copy_out_rate(db, n)
        retention = Retention(db, SinkMetrics(CollectorRegistry()), keep_raw_days=30, archive_dir=Path(tmp))
        start = time.perf_counter()
        dropped = retention.run_once()
        archive_rate = n / (time.perf_counter() - start)
        files = sorted(Path(tmp).rglob("*.parquet"))
        archived = ds.dataset(files, format="parquet").to_table()
        if archived.num_rows != n or dropped["gpu_metrics"] < 1:
            raise RuntimeError(f"archived {archived.num_rows} of {n} rows, dropped {dropped}")
        parquet = sum(f.stat().st_size for f in files)
        report(
            "parquet bytes/row (zstd 9, the default)",
            parquet / n,
            "B",
            "hypertable bytes/row (heap+TOAST+index)",
            total / n,
        )
        report(
            "parquet bytes/row (zstd 9, the default)",
            parquet / n,
            "B",
            "hypertable bytes/row (heap only)",
            heap / n,
        )
        for level in (1, 3, 19):
            report(f"parquet bytes/row (zstd {level}, one file)", reencoded_bytes(archived, level) / n, "B",
                   "hypertable bytes/row (heap+TOAST+index)", total / n)  # fmt: skip
        report(
            "archive rows/s (read+write+fsync+verify+drop)",
            archive_rate,
            "rows/s",
            "binary COPY TO STDOUT rows/s",
            copy_rate,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

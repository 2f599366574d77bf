"""Sink throughput from a pre-filled topic, next to a raw binary COPY of the same rows.

Both write the same samples into a fresh `gpu_metrics` hypertable (each in its
own schema with the project's migrations). The sink's figure covers consume +
decode/validate + COPY to staging + INSERT ... ON CONFLICT + gpu_latest,
gpu_assets and rollup maintenance + offsets, all in one transaction per batch;
it is timed from the moment it owns its partitions (group join excluded).
The baseline is psycopg's binary COPY of the already-built rows straight into
the hypertable: no Kafka, no validation, no idempotency. Target: ratio >= 0.5.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench._common import report, scratch_topic
from evaluation.pipeline import make_loop
from services.sink.__main__ import SinkSection
from services.sink.rows import METRIC_COLUMNS, STAGE_TYPES, sample_row
from shared.config import DatabaseSettings, Settings, TopicSettings
from shared.db import connect
from shared.kafka import wait_for_kafka
from shared.migrate import apply_migrations, discover
from shared.models import parse_sample
from tests.integration.sink_helpers import produce_samples, sample

N, GPUS = 200_000, 1000


def fresh_schema(db: DatabaseSettings) -> DatabaseSettings:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with connect(db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    scoped = db.model_copy(update={"search_path": name})
    with connect(scoped) as conn:
        apply_migrations(conn, discover())
    return scoped


def drop_schema(db: DatabaseSettings) -> None:
    with connect(db.model_copy(update={"search_path": None}), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(db.search_path or "")))


def stored_offsets(conn: psycopg.Connection[tuple[object, ...]], group: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets WHERE consumer_group = %s", (group,)
    ).fetchone()
    return int(str(row[0])) if row else 0


def main() -> int:
    settings = Settings()
    wait_for_kafka(settings.kafka)
    sink_db, copy_db = fresh_schema(settings.db), fresh_schema(settings.db)
    try:
        with scratch_topic(settings.kafka, partitions=6) as raw:
            produce_samples(settings.kafka, raw, 0, N, gpus=GPUS)
            topics = TopicSettings(metrics_raw=raw, events=f"{raw}-none", dlq=f"{raw}-none")
            group = f"bench-{uuid.uuid4().hex[:8]}"
            loop = make_loop(settings.kafka, sink_db, topics, group, batch_size=SinkSection().batch_size)
            thread = threading.Thread(target=loop.run, daemon=True)
            thread.start()
            while not loop.owned:
                time.sleep(0.01)
            # One open connection to watch the stored offsets: a new one per poll costs a backend fork.
            with connect(sink_db, autocommit=True) as watch:
                start = time.perf_counter()
                while stored_offsets(watch, group) < N:
                    time.sleep(0.02)
                sink_s = time.perf_counter() - start
            loop.stop.set()
            thread.join(60)
            loop.consumer.close()
            loop.writer.close()

        rows = [sample_row(parse_sample(__import__("json").dumps(sample(i, GPUS)))) for i in range(N)]
        width = len(METRIC_COLUMNS)
        with connect(copy_db) as conn, conn.cursor() as cur:
            start = time.perf_counter()
            with cur.copy(
                sql.SQL("COPY gpu_metrics ({}) FROM STDIN (FORMAT BINARY)").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in METRIC_COLUMNS)
                )
            ) as copy:
                copy.set_types(STAGE_TYPES[:width])
                for row in rows:
                    copy.write_row(row[:width])
            conn.commit()
            copy_s = time.perf_counter() - start
    finally:
        drop_schema(sink_db)
        drop_schema(copy_db)
    report(
        f"sink samples/s ({N:,} samples, {GPUS} GPUs)",
        N / sink_s,
        "rows/s",
        "raw binary COPY",
        N / copy_s,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Parquet archive: a chunk past retention is written to Parquet before it is dropped.

Layout (Hive-style, so DuckDB, Spark or pyarrow read it as one dataset)::

    <archive_dir>/table=<hypertable>/day=<YYYY-MM-DD>/<range start>-<chunk>.parquet
    <archive_dir>/table=<hypertable>/day=<YYYY-MM-DD>/<range start>-<chunk>.manifest.json

One file per chunk and UTC day (a 6-hour chunk is one file, a 7-day rollup
chunk seven), zstd-compressed, rows ordered by GPU then time. The manifest
beside each file gives its rows, bytes, min/max time, SHA-256, the chunk and
its range.

Crash safety, step by step, inside one transaction that holds a SHARE lock on
the chunk (late rows for that time range wait rather than slip in between
the copy and the drop): rows are streamed (COPY, see shared/store/archive.py) into a
hidden temporary file; the file is closed and fsynced, re-read (its footer
and its whole time column) and its row count checked; it is renamed to its
final name and the directory fsynced; the manifest is written the same way;
the total in the files is checked against ``count(*)`` of the chunk; only
then is exactly that chunk dropped and the transaction committed. A crash at
any point before the commit leaves the chunk in the database and at worst a
complete file with the same name as the re-run will write (it is replaced
atomically, never duplicated) or a temporary file (removed by the next run).
Names depend only on the chunk, so re-running a chunk is idempotent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared.plumbing.durable import fsync_dir, fsync_file
from shared.plumbing.errors import GpuHealthError
from shared.store.archive import Chunk, Conn, arrow_schema, chunk_batches, columns_of, count_rows

log = logging.getLogger(__name__)


class ArchiveError(GpuHealthError):
    """An archive file could not be written or did not read back as written: nothing is dropped."""


class ArchiveInterruptedError(ArchiveError):
    """The service is stopping; the chunk stays in the database for the next run."""


@dataclass(frozen=True, slots=True)
class ArchivedFile:
    path: Path
    rows: int
    bytes: int
    sha256: str
    min_time: datetime | None
    max_time: datetime | None


@dataclass(slots=True)
class ArchivedChunk:
    chunk: Chunk
    files: list[ArchivedFile] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def archive_schema(columns: list[tuple[str, str]], chunk: Chunk) -> pa.Schema:
    return arrow_schema(
        columns,
        metadata={
            "gpuhealth.table": chunk.hypertable,
            "gpuhealth.chunk": f"{chunk.schema}.{chunk.name}",
            "gpuhealth.range": f"{chunk.start.isoformat()}/{chunk.end.isoformat()}",
        },
    )


def file_name(chunk: Chunk) -> str:
    """Depends only on the chunk: a re-run replaces the same file instead of adding another."""
    start = chunk.start.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{start}-{chunk.name}.parquet"


def make_dirs(path: Path) -> None:
    """mkdir -p, with each new directory's entry fsynced into its parent."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class DayFile:
    """One day's part of a chunk: written to a hidden temporary file, published by finish()."""

    def __init__(self, final: Path, schema: pa.Schema, time_column: str, zstd_level: int) -> None:
        self.final, self.time_column = final, time_column
        self.tmp = final.with_name(f".{final.name}.tmp")
        make_dirs(final.parent)
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="zstd", compression_level=zstd_level)
        self.rows = 0
        self.min_time: datetime | None = None
        self.max_time: datetime | None = None

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows
        bounds = pc.min_max(table[self.time_column])
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is not None:
            self.min_time = low if self.min_time is None else min(self.min_time, low)
            self.max_time = high if self.max_time is None else max(self.max_time, high)

    def abandon(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)

    def finish(self, chunk: Chunk) -> ArchivedFile:
        self.writer.close()
        fsync_file(self.tmp)
        read_back = pq.read_table(self.tmp, columns=[self.time_column]).num_rows
        if read_back != self.rows or pq.ParquetFile(self.tmp).metadata.num_rows != self.rows:
            raise ArchiveError(f"{self.tmp} reads back {read_back} rows, {self.rows} were written")
        checksum = sha256_of(self.tmp)
        os.replace(self.tmp, self.final)
        fsync_dir(self.final.parent)
        size = self.final.stat().st_size
        manifest = {
            "file": self.final.name,
            "table": chunk.hypertable,
            "day": self.final.parent.name.removeprefix("day="),
            "rows": self.rows,
            "bytes": size,
            "sha256": checksum,
            "min_time": self.min_time.isoformat() if self.min_time else None,
            "max_time": self.max_time.isoformat() if self.max_time else None,
            "chunk": f"{chunk.schema}.{chunk.name}",
            "chunk_range": [chunk.start.isoformat(), chunk.end.isoformat()],
            "time_column": self.time_column,
            "compression": "zstd",
            "written_at": datetime.now(UTC).isoformat(),
        }
        write_atomically(manifest_path(self.final), json.dumps(manifest, indent=1).encode())
        return ArchivedFile(self.final, self.rows, size, checksum, self.min_time, self.max_time)


def manifest_path(parquet: Path) -> Path:
    return parquet.with_name(parquet.name.removesuffix(".parquet") + ".manifest.json")


def by_day(table: pa.Table, time_column: str) -> Iterator[tuple[date, pa.Table]]:
    """The rows of `table` split by the UTC day of `time_column` (usually all one day)."""
    days = pc.cast(table[time_column], pa.date32())
    bounds = pc.min_max(days)
    first, last = bounds["min"].as_py(), bounds["max"].as_py()
    if first is None:
        raise ArchiveError(f"rows without a {time_column}")
    if first == last:
        yield first, table
        return
    for day in pc.unique(days).to_pylist():
        yield day, table.filter(pc.equal(days, pa.scalar(day, pa.date32())))


class ParquetArchive:
    """Writes chunks under `root`; the caller holds the chunk's lock and drops it afterwards."""

    def __init__(self, root: Path, *, batch_bytes: int = 16 << 20, zstd_level: int = 9) -> None:
        self.root, self.batch_bytes, self.zstd_level = root, batch_bytes, zstd_level

    def path_for(self, chunk: Chunk, day: date) -> Path:
        return self.root / f"table={chunk.hypertable}" / f"day={day.isoformat()}" / file_name(chunk)

    def remove_leftovers(self) -> int:
        """Delete temporary files a killed run left behind (call while holding the retention lock)."""
        removed = 0
        if self.root.is_dir():
            for tmp in self.root.rglob(".*.tmp"):
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed

    def write_chunk(self, conn: Conn, chunk: Chunk, stop: threading.Event | None = None) -> ArchivedChunk:
        """Stream the chunk into its day files and publish them; ArchiveError if anything is off."""
        columns = columns_of(conn, chunk.relation(conn))
        schema = archive_schema(columns, chunk)
        # GPU then time: a GPU's readings side by side is what makes the columns compress.
        order = ["gpu_uuid"] if "gpu_uuid" in {name for name, _ in columns} else []
        order.append(chunk.time_column)
        files: dict[date, DayFile] = {}
        try:
            # closing(): a failure while the COPY is still streaming must end it before the rollback
            batches = closing(
                chunk_batches(conn, chunk, columns, schema, order_by=order, block_bytes=self.batch_bytes)
            )
            with batches as tables:
                for table in tables:
                    if stop is not None and stop.is_set():
                        raise ArchiveInterruptedError(f"stopping: {chunk.name} left for the next run")
                    for day, part in by_day(table, chunk.time_column):
                        if day not in files:
                            path = self.path_for(chunk, day)
                            files[day] = DayFile(path, schema, chunk.time_column, self.zstd_level)
                        files[day].write(part)
            archived = ArchivedChunk(chunk, [files.pop(day).finish(chunk) for day in sorted(files)])
        finally:
            for leftover in files.values():
                leftover.abandon()
        in_db = count_rows(conn, chunk)
        if in_db != archived.rows:
            raise ArchiveError(f"{chunk.name}: {in_db} rows in the chunk, {archived.rows} in the archive")
        return archived

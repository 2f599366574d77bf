"""The archive's file side: rows to Arrow, split by day, published atomically with a manifest."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.sink.archive import (
    ArchiveError,
    DayFile,
    archive_schema,
    by_day,
    file_name,
    manifest_path,
)
from shared.store.archive import Chunk

COLUMNS = [("time", "timestamp with time zone"), ("gpu_uuid", "text"), ("gpu_temp_c", "double precision"),
           ("total_energy_mj", "bigint"), ("mig", "jsonb"), ("gpu_index", "smallint")]  # fmt: skip
CHUNK = Chunk("gpu_metrics", "_timescaledb_internal", "_hyper_1_7_chunk",
              datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 8, tzinfo=UTC), "time")  # fmt: skip
relaxed = settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])

times = st.datetimes(
    min_value=datetime(2026, 10, 1), max_value=datetime(2026, 10, 7, 23, 59, 59), timezones=st.just(UTC)
)
rows = st.lists(
    st.tuples(
        times,
        st.text(max_size=40),  # hostile text: quotes, newlines, NULs, astral characters
        st.one_of(st.none(), st.floats(allow_infinity=True, allow_nan=True)),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        st.one_of(st.none(), st.just('[{"profile": "1g.10gb"}]')),
        st.one_of(st.none(), st.integers(-(2**15), 2**15 - 1)),
    ),
    min_size=1,
    max_size=60,
)


def to_arrow(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def same(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b


@relaxed
@given(rows=rows)
def test_rows_split_by_day_lose_and_move_nothing(rows: list[tuple[Any, ...]]) -> None:
    table = to_arrow(rows, archive_schema(COLUMNS, CHUNK))
    parts = list(by_day(table, "time"))
    assert sum(part.num_rows for _, part in parts) == len(rows)
    assert len({day for day, _ in parts}) == len(parts)
    for day, part in parts:
        assert {t.date() for t in part["time"].to_pylist()} == {day}
    back = sorted((r for _, part in parts for r in part.to_pylist()), key=repr)
    want = sorted((dict(zip([c for c, _ in COLUMNS], r, strict=True)) for r in rows), key=repr)
    assert all(same(b[k], w[k]) for b, w in zip(back, want, strict=True) for k in w)


def test_names_depend_only_on_the_chunk() -> None:
    assert file_name(CHUNK) == "20261001T000000Z-_hyper_1_7_chunk.parquet"
    assert manifest_path(Path("/a/x.parquet")) == Path("/a/x.manifest.json")


@relaxed
@given(rows=rows)
def test_a_day_file_is_published_whole_with_a_matching_manifest(rows: list[tuple[Any, ...]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        schema = archive_schema(COLUMNS, CHUNK)
        final = Path(tmp) / "table=gpu_metrics" / "day=2026-10-01" / file_name(CHUNK)
        day_file = DayFile(final, schema, "time", zstd_level=3)
        day_file.write(to_arrow(rows, schema))
        assert not final.exists(), "nothing under the final name before finish()"
        published = day_file.finish(CHUNK)
        assert sorted(p.name for p in final.parent.iterdir()) == sorted(
            [final.name, manifest_path(final).name]
        )
        manifest = json.loads(manifest_path(final).read_text())
        assert manifest["rows"] == published.rows == len(rows) == pq.ParquetFile(final).metadata.num_rows
        assert manifest["min_time"] == min(r[0] for r in rows).isoformat()
        assert manifest["max_time"] == max(r[0] for r in rows).isoformat()
        assert pq.read_schema(final).metadata[b"gpuhealth.chunk"] == b"_timescaledb_internal._hyper_1_7_chunk"


def test_a_file_that_does_not_read_back_is_never_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = archive_schema(COLUMNS, CHUNK)
    final = tmp_path / file_name(CHUNK)
    day_file = DayFile(final, schema, "time", zstd_level=3)
    day_file.write(
        to_arrow([(datetime(2026, 10, 1, tzinfo=UTC) + timedelta(hours=1), "G", 1.0, 1, None, 1)], schema)
    )
    day_file.rows += 1  # as if a row had been lost on the way to disk
    with pytest.raises(ArchiveError, match="reads back"):
        day_file.finish(CHUNK)
    assert not final.exists()
    assert not manifest_path(final).exists()

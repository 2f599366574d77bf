"""copy_batches on the real PostgreSQL: any value a row can hold comes back exactly (hypothesis)."""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.archive import arrow_schema, copy_batches

COLUMNS = [("t", "timestamp with time zone"), ("s", "text"), ("x", "double precision"), ("r", "real"),
           ("n", "bigint"), ("i", "integer"), ("b", "boolean"), ("j", "jsonb")]  # fmt: skip
text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=40)
row = st.tuples(
    st.one_of(st.none(), st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                                      timezones=st.just(UTC))),
    st.one_of(st.none(), text, st.sampled_from(["", "NULL", "NaN", "N/A", "t", '""', "\\N", ",\n\r\""])),
    st.one_of(st.none(), st.floats(width=64)),
    st.one_of(st.none(), st.floats(width=32)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.dictionaries(text, st.one_of(text, st.integers(-(10**9), 10**9)), max_size=3)),
)  # fmt: skip


def as_float32(value: Any) -> Any:
    return None if value is None else struct.unpack("f", struct.pack("f", value))[0]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return bool(a == b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(rows=st.lists(row, max_size=30))
def test_every_value_comes_back_exactly(db_settings: DatabaseSettings, rows: list[tuple[Any, ...]]) -> None:
    with connect(db_settings, autocommit=True) as conn:
        conn.execute(
            "CREATE TEMP TABLE r (t timestamptz, s text, x float8, r float4, n int8, i int4, b bool, j jsonb)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO r VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(*r[:7], Jsonb(r[7]) if r[7] is not None else None) for r in rows],
            )
        stored = conn.execute("SELECT t, s, x, r, n, i, b, j::text FROM r").fetchall()
        got = [
            tuple(d.values())
            for table in copy_batches(
                conn, sql.Identifier("r"), COLUMNS, arrow_schema(COLUMNS), block_bytes=1 << 20
            )
            for d in table.to_pylist()
        ]
    assert len(got) == len(stored) == len(rows)
    for back, want in zip(got, stored, strict=True):
        # a `real` is a float32: PostgreSQL's text of it parses to the float32 itself, psycopg widens it
        want = (*want[:3], as_float32(want[3]), *want[4:])
        assert all(same(b, w) for b, w in zip(back[:7], want[:7], strict=True)), (back, want)
        assert back[7] == want[7]  # jsonb as PostgreSQL's own text of it
        if back[7] is not None:
            json.loads(back[7])


def test_a_row_larger_than_a_block_is_an_error_not_a_loss(db_settings: DatabaseSettings) -> None:
    with connect(db_settings, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE big (s text)")
        conn.execute("INSERT INTO big SELECT repeat(E'line\\n', 200000)")
        with pytest.raises(pa.ArrowInvalid):
            list(copy_batches(conn, sql.Identifier("big"), [("s", "text")], arrow_schema([("s", "text")]),
                              block_bytes=64 << 10))  # fmt: skip
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (1,)  # the connection is usable

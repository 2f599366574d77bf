"""The compiled COPY encoder (shared.fastcopy) against the pydantic contract and psycopg.

Whatever it accepts, pydantic must accept, and its bytes must be exactly what
psycopg sends for pydantic's row (encoded_as_pydantic). What the collectors
send must be accepted, or the sink loses its fast path without a word.
Hostile and random messages for the whole contract go through the same check
in test_fastdecode.py; here: numbers, times, bytes mutated at random, keys,
batches, and the schema compiler.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import services.sink.writer as writer_module
from services.sink.rows import (
    FAST_SAMPLE,
    GPU_UUID,
    SAMPLE_COPY,
    STAGE_COLUMNS,
    STAGE_TYPES,
    TIME,
    newest_per_gpu,
    stage_row,
)
from services.sink.writer import Batch
from shared import fastcopy
from shared.errors import ContractError
from shared.fastcopy import CopyEncoder, as_time, as_us
from shared.fastdecode import SchemaNotSupportedError
from shared.jsonlimits import MAX_RECORD_BYTES
from shared.models import GpuSample, parse_sample, sample_time_bounds, to_json
from shared.store.samples import LATEST_STAGE, WIDTH
from tests.helpers.copy_binary import binary_row
from tests.unit.shared.test_fastdecode import GOOD, GOOD_RAW, UUID, encoded_as_pydantic

assert SAMPLE_COPY is not None, "shared/_fastcopy is not built: run make venv"
ENCODER = SAMPLE_COPY
FLOAT_FIELDS = [c for c, t in zip(STAGE_COLUMNS, STAGE_TYPES, strict=True) if t == "double precision"]
INT_FIELDS = [c for c, t in zip(STAGE_COLUMNS, STAGE_TYPES, strict=True) if t == "bigint"]


def with_value(field: str, text: str) -> bytes:
    """GOOD with `field` set to the JSON text given as is."""
    return json.dumps({**GOOD, field: "@@"}).replace('"@@"', text).encode()


@pytest.mark.parametrize(
    "raw",
    [
        GOOD_RAW,
        json.dumps(GOOD, indent=2).encode(),  # whitespace anywhere JSON allows it
        json.dumps(to_json(parse_sample(GOOD_RAW))).encode(),  # what collectors publish: nulls, "mig": []
        json.dumps({**GOOD, "time": "2026-11-21T13:30:00.5+02:30"}).encode(),
        json.dumps({**GOOD, "time": "2026-11-21T11:00:00.123999Z"}).encode(),  # cut to ms
        json.dumps({**GOOD, "time": "2026-11-21T02:00:00-09:00"}).encode(),
        json.dumps({**GOOD, "gpu_uuid": "MIG-91310d89-c3e8-4b50-81d8-a29050bc85cc/1/0"}).encode(),
        with_value("gpu_temp_c", "-0"),
        with_value("power_usage_w", "4.125e2"),
        with_value("gpu_util_pct", "0.30000000000000004"),  # 17 digits: Python's own parser
        with_value("prof_sm_active_ratio", "1E-1"),
        with_value("total_energy_mj", "9223372036854775791"),  # the largest the contract allows
    ],
)
def test_what_collectors_send_is_encoded_as_psycopg_would(raw: bytes) -> None:
    assert encoded_as_pydantic(raw)


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps({**GOOD, "hostname": "n\u00f6de"}, ensure_ascii=False).encode(),  # UTF-8
        json.dumps({**GOOD, "hostname": "n\u00f6de"}).encode(),  # an escape
        json.dumps({**GOOD, "hostname": 'say "hi"'}).encode(),
        json.dumps({**GOOD, "mig": [{"profile": "1g.10gb", "instance_id": 1}]}).encode(),
        GOOD_RAW[:-1] + b', "hostname": "n2"}',  # a key given twice
        with_value("gpu_temp_c", "61.0000000000000000000000000000000000000000000000000000000000000001"),
        json.dumps({**GOOD, "time": "2026-11-21T11:00:00.1234567Z"}).encode(),  # pydantic decides
        json.dumps({**GOOD, "time": "2026-11-21t11:00:00Z"}).encode(),
    ],
)
def test_forms_it_does_not_know_are_declined_and_not_lost(raw: bytes) -> None:
    """Valid messages in a form the encoder does not take: it declines, the decoders store them."""
    assert ENCODER.encode([raw], [None]) is None
    stage_row(raw)  # raises ContractError if refused


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(FLOAT_FIELDS + INT_FIELDS),
    sign=st.sampled_from(["", "-"]),
    whole=st.integers(0, 10**25).map(str) | st.sampled_from(["0", "00", "01"]),
    fraction=st.none() | st.text("0123456789", min_size=0, max_size=25),
    exponent=st.none()
    | st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 99)),
)
def test_any_number_text_is_encoded_as_python_reads_it_or_declined(
    field: str, sign: str, whole: str, fraction: str | None, exponent: tuple[str, str, int] | None
) -> None:
    text = sign + whole + ("" if fraction is None else "." + fraction)
    if exponent is not None:
        text += f"{exponent[0]}{exponent[1]}{exponent[2]}"
    encoded_as_pydantic(with_value(field, text))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(FLOAT_FIELDS),
    number=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60),
)
def test_any_float_python_writes_is_encoded_exactly(field: str, number: object) -> None:
    """repr() gives the shortest text that reads back to the same double: every such number in
    bounds must be taken, and converted exactly."""
    raw = with_value(field, json.dumps(number))
    accepted = encoded_as_pydantic(raw)
    exact = isinstance(number, float) or (isinstance(number, int) and abs(number) <= 2**53)
    if exact and stage_rows_accept(raw):
        assert accepted, raw


def stage_rows_accept(raw: bytes) -> bool:
    try:
        stage_row(raw)
    except ContractError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    when=st.datetimes(datetime(1999, 12, 30), datetime(2028, 1, 1)),
    offset_minutes=st.none() | st.integers(-(24 * 60 - 1), 24 * 60 - 1),
    digits=st.integers(0, 7),
)
def test_any_plain_rfc3339_time_is_encoded_as_python_reads_it(
    when: datetime, offset_minutes: int | None, digits: int
) -> None:
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{when.microsecond:06d}{when.microsecond % 10}"[:digits]
    if offset_minutes is None:
        text += "Z"
    else:
        sign = "-" if offset_minutes < 0 else "+"
        text += f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
    raw = json.dumps({**GOOD, "time": text}).encode()
    accepted = encoded_as_pydantic(raw)
    if digits <= 6 and stage_rows_accept(raw):
        assert accepted, raw  # the plain form, in bounds: the encoder's to take


@pytest.mark.parametrize(
    "time", ["2028-02-30T00:00:00Z", "2024-02-29T24:00:00Z", "2026-13-01T00:00:00Z", "2026-11-21T11:00:60Z",
             "2026-11-21T11:00:00+24:00", "2026-11-21T11:00:00+01:60", "0000-01-01T00:00:00Z",
             "2026-11-21T11:00:00.Z", "2026-11-21T11:00:00+0100", "2026-11-21T11:00:00Z ",
             "2026-11-21T11:00:00"],
)  # fmt: skip
def test_impossible_times_are_declined(time: str) -> None:
    assert ENCODER.encode([json.dumps({**GOOD, "time": time}).encode()], [None]) is None


def test_the_time_bounds_are_the_contracts_and_inclusive() -> None:
    earliest, latest = sample_time_bounds()
    at_floor = json.dumps({**GOOD, "time": earliest.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
    assert encoded_as_pydantic(at_floor)
    before = json.dumps({**GOOD, "time": "1999-12-31T23:59:59.999Z"}).encode()
    assert ENCODER.encode([before], [None]) is None
    beyond = (latest + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ENCODER.encode([json.dumps({**GOOD, "time": beyond}).encode()], [None]) is None


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(GOOD_RAW)), st.sampled_from(["insert", "delete", "replace"]),
                  st.binary(min_size=1, max_size=3) | st.sampled_from([b'"', b"\\", b",", b"}", b"{", b"0"])),
        min_size=1, max_size=4,
    )
)  # fmt: skip
def test_bytes_changed_anywhere_are_declined_or_encoded_as_pydantic_reads_them(
    edits: list[tuple[int, str, bytes]],
) -> None:
    raw = bytearray(GOOD_RAW)
    for at, how, data in edits:
        at = min(at, len(raw))
        if how == "insert":
            raw[at:at] = data
        elif how == "delete":
            del raw[at : at + len(data)]
        else:
            raw[at : at + len(data)] = data
    encoded_as_pydantic(bytes(raw))


def test_keys_must_be_the_gpus_uuid_and_valid_or_the_batch_is_declined() -> None:
    assert ENCODER.encode([GOOD_RAW, GOOD_RAW], [None, UUID.encode()]) is not None
    assert ENCODER.encode([GOOD_RAW, GOOD_RAW], [None, b"GPU-someone-else"]) is None
    short = json.dumps({**GOOD, "gpu_uuid": "GPU-short"}).encode()  # the key column's pattern
    assert ENCODER.encode([GOOD_RAW, short], [None, None]) is None
    for _ in range(2):  # once checked and remembered, a bad one is still refused
        assert ENCODER.encode([json.dumps({**GOOD, "gpu_uuid": UUID + "\n"}).encode()], [None]) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)), max_size=40))
def test_a_batch_gives_each_gpus_newest_row_and_first_time_as_the_decoders_do(
    picks: list[tuple[int, int]],
) -> None:
    """Rows in any order, ties included: the latest rows are newest_per_gpu's, byte for byte."""
    raws = [
        json.dumps({**GOOD, "gpu_uuid": f"GPU-{gpu:08d}-0000", "time": f"2026-11-21T11:00:0{second}Z",
                    "gpu_temp_c": n}).encode()
        for n, (gpu, second) in enumerate(picks)
    ]  # fmt: skip
    encoded = ENCODER.encode(raws, [None] * len(raws))
    assert encoded is not None
    rows = [stage_row(raw) for raw in raws]
    assert encoded.table_rows == b"".join(binary_row(r[:WIDTH], STAGE_TYPES[:WIDTH]) for r in rows)
    newest = newest_per_gpu(rows)
    assert encoded.latest_rows == b"".join(binary_row(r, LATEST_STAGE.types) for r in newest)
    assert encoded.keys == [r[GPU_UUID] for r in newest]
    assert [as_time(t) for t in encoded.times] == [r[TIME] for r in rows]
    assert len(encoded) == len(raws)


def test_a_batch_is_declined_whole_for_one_message() -> None:
    assert ENCODER.encode([GOOD_RAW, GOOD_RAW, b"{}"], [None] * 3) is None
    empty = ENCODER.encode([], [])
    assert empty is not None
    assert (empty.table_rows, empty.latest_rows, empty.keys, len(empty)) == (b"", b"", [], 0)
    with pytest.raises(TypeError):
        ENCODER.encode(["not bytes"], [None])  # type: ignore[list-item]


def test_a_message_longer_than_the_contract_allows_is_declined_by_every_fast_path() -> None:
    raw = GOOD_RAW[:-1] + b" " * MAX_RECORD_BYTES + b"}"  # valid JSON, but too long a record
    assert ENCODER.encode([GOOD_RAW, raw], [None, None]) is None
    assert FAST_SAMPLE.decode(raw) is None
    assert FAST_SAMPLE.decode_many([GOOD_RAW, raw]) is None
    with pytest.raises(ContractError, match="exceeds"):
        stage_row(raw)


def test_an_encoded_sample_refused_when_decoded_again_becomes_a_dead_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The careful path decodes an encoded batch again; should the decoders refuse a message
    the encoder took (they never do: the tests above), it is dead-lettered, not retried for ever."""
    raws = [json.dumps({**GOOD, "time": f"2026-11-21T11:00:0{s}Z"}).encode() for s in range(3)]
    batch = Batch(encoded=ENCODER.encode(raws, [None] * 3), next_offsets={("raw", 0): 3})
    batch.row_origins = [("raw", 0, n, None, raw) for n, raw in enumerate(raws)]

    def refuse_the_second(raw: bytes) -> Any:
        if raw == raws[1]:
            raise ContractError("refused after all")
        return stage_row(raw)

    monkeypatch.setattr(writer_module, "stage_row", refuse_the_second)
    batch.decode_encoded()
    assert batch.encoded is None
    assert batch.rows == [stage_row(raws[0]), stage_row(raws[2])]
    assert [origin[2] for origin in batch.row_origins] == [0, 2]
    assert [(d.offset, d.category, d.reason) for d in batch.dead] == [(1, "contract", "refused after all")]


def test_times_round_trip_to_microseconds() -> None:
    t = datetime(2026, 11, 21, 11, 0, 0, 123000, tzinfo=UTC)
    assert as_time(as_us(t)) == t


def schema() -> dict[str, Any]:
    return GpuSample.model_json_schema()


def encoder(s: dict[str, Any], types: tuple[str, ...] = STAGE_TYPES) -> CopyEncoder:
    module = fastcopy.compiled()
    assert module is not None
    return CopyEncoder(
        module, s, STAGE_COLUMNS, types, width=WIDTH, key="gpu_uuid", time="time",
        time_bounds=sample_time_bounds,
    )  # fmt: skip


def test_the_compiler_refuses_what_it_cannot_translate() -> None:
    encoder(schema())  # the contract itself compiles
    props = schema()["properties"]
    cases = {
        "pattern": {**props, "hostname": {"type": "string", "pattern": "^[a-z]+$"}},
        "multipleOf": {**props, "gpu_index": {"type": "integer", "multipleOf": 2}},
        "bounds": {**props, "gpu_index": {"type": "integer", "maximum": 2**20}},  # wider than smallint
        "jsonb": {**props, "gpu_index": {"type": "integer"}},
    }
    as_jsonb = tuple(
        "jsonb" if c == "gpu_index" else t for c, t in zip(STAGE_COLUMNS, STAGE_TYPES, strict=True)
    )
    types = {"jsonb": as_jsonb}
    for name, properties in cases.items():
        with pytest.raises(SchemaNotSupportedError):
            encoder({**schema(), "properties": properties}, types.get(name, STAGE_TYPES))
    with pytest.raises(SchemaNotSupportedError, match="closed"):
        encoder({**schema(), "additionalProperties": True})
    with pytest.raises(SchemaNotSupportedError, match="every property"):
        encoder({**schema(), "properties": {**props, "extra": {"type": "integer"}}})

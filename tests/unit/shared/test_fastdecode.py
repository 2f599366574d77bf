"""The sink's compiled fast decoder against the pydantic contract it is compiled from.

The fast path may decline anything (pydantic then decides), but whatever it
accepts pydantic must accept too, with the very same row.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from gpuhealth.contract.jsonlimits import MAX_RECORD_BYTES
from services.sink.rows import FAST_SAMPLE, sample_row, stage_row
from shared.contract.fastdecode import FastDecoder, SchemaNotSupportedError, python_pattern
from shared.contract.models import METRIC_FIELDS, GpuSample, parse_sample, sane_time, to_json
from shared.plumbing.errors import ContractError

UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
GOOD: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-21T11:00:00.123Z", "source": "dcgm", "collector_id": "node-7",
    "collection_latency_ms": 1.5, "gpu_uuid": UUID, "gpu_index": 3, "model": "NVIDIA H100 80GB HBM3",
    "hostname": "gpu-node-07", "cluster": "c1", "datacenter": "dc1", "rack": "r1", "job": "train",
    "gpu_temp_c": 61, "power_usage_w": 412.5, "gpu_util_pct": 97.0, "ecc_dbe_volatile_total": 0,
    "fb_total_mib": 81559, "clocks_event_reasons": 4, "prof_tensor_active_ratio": 0.41,
}  # fmt: skip
GOOD_RAW = json.dumps(GOOD).encode()


def comparable(row: tuple[Any, ...]) -> list[Any]:
    """Rows as plain values with their types (Jsonb compares by identity; enums as their text)."""
    out = []
    for v in row:
        if isinstance(v, Jsonb):
            v = v.obj
        elif isinstance(v, datetime):  # the fast path's own subclass, DecodedTime
            v = datetime.combine(v.date(), v.timetz())
        elif isinstance(v, str):
            v = str(v)
        out.append((type(v).__name__, v))
    return out


def pydantic_row(raw: bytes) -> tuple[Any, ...] | None:
    try:
        return sample_row(parse_sample(raw))
    except ContractError:
        return None


def check(message: dict[str, Any] | str | bytes) -> tuple[Any, ...] | None:
    """The property: the fast path accepts only what pydantic accepts, with the same row."""
    if isinstance(message, bytes):
        raw = message
    else:
        raw = (message if isinstance(message, str) else json.dumps(message, allow_nan=True)).encode()
    # A batch's verdict first (decode remembers the labels it checked): it declines the batch
    # exactly when decode declines one of its messages, and otherwise gives decode's rows.
    many = FAST_SAMPLE.decode_many([GOOD_RAW, raw])
    fast, slow = FAST_SAMPLE.decode(raw), pydantic_row(raw)
    assert (many is None) == (fast is None), f"decode_many and decode disagree on {raw!r}"
    if many is not None and fast is not None:
        assert [comparable(row) for row in many] == [
            comparable(FAST_SAMPLE.decode(GOOD_RAW) or ()),
            comparable(fast),
        ]
    if fast is not None:
        assert slow is not None, f"fast path accepted what the contract refuses: {raw!r}"
        assert comparable(stage_row(raw)) == comparable(slow)
    return slow if fast is not None else None


@pytest.mark.parametrize(
    "message",
    [
        GOOD,
        {**GOOD, "time": "2026-11-21T11:00:00+00:00"},
        {**GOOD, "time": "2026-11-21T13:30:00.5+02:30"},  # converted to UTC
        {**GOOD, "time": "2026-11-21T11:00:00.123456Z"},  # cut to ms, as the contract does
        {**GOOD, "gpu_uuid": "MIG-91310d89-c3e8-4b50-81d8-a29050bc85cc/1/0"},
        {**GOOD, "mig": [{"profile": "1g.10gb", "instance_id": 1, "gpu_util_pct": 12.5}]},
        to_json(parse_sample(json.dumps(GOOD))),  # what the collector publishes
    ],
)
def test_the_messages_collectors_send_take_the_fast_path_with_the_same_row(message: dict[str, Any]) -> None:
    assert check(message) is not None


HOSTILE: list[Any] = [
    {**GOOD, "gpu_temp_c": "61"},  # wrong type
    {**GOOD, "gpu_index": 1.0},  # float for int
    {**GOOD, "gpu_index": True},  # bool for int
    {**GOOD, "gpu_temp_c": True},
    {**GOOD, "gpu_temp_c": float("nan")},
    {**GOOD, "power_usage_w": float("inf")},
    {**GOOD, "power_usage_w": 1e999},
    {**GOOD, "ecc_dbe_volatile_total": 2**63 - 1},  # a DCGM blank that slipped through
    {**GOOD, "ecc_dbe_volatile_total": 10**400},
    {**GOOD, "ecc_dbe_volatile_total": -1},
    {**GOOD, "schema_version": 2},
    {**GOOD, "schema_version": True},
    {**GOOD, "source": "DCGM"},
    {**GOOD, "surprise": 1},
    {k: v for k, v in GOOD.items() if k != "hostname"},
    {**GOOD, "hostname": ""},
    {**GOOD, "hostname": "node\n"},  # Python's '$' would let this through
    {**GOOD, "cluster": "a\u0000b"},
    {**GOOD, "rack": "x" * 254},
    {**GOOD, "gpu_uuid": "GPU-short"},
    {**GOOD, "gpu_uuid": UUID + "\n"},
    {**GOOD, "time": "2026-11-21T11:00:00"},  # no timezone
    {**GOOD, "time": "1999-12-31T23:59:59Z"},
    {**GOOD, "time": "2099-01-01T00:00:00Z"},
    {**GOOD, "time": "2026-11-21T24:00:00Z"},
    {**GOOD, "time": 1795267200},
    {**GOOD, "mig": [{"profile": "1g.10gb", "instance_id": 65}]},
    {**GOOD, "mig": [{"profile": "1g\n", "instance_id": 1}]},
    {**GOOD, "mig": [{"profile": "1g.10gb", "instance_id": 1, "extra": 1}]},
    {**GOOD, "mig": {"profile": "1g.10gb"}},
    '{"schema_version": 1, "time": "2026-11-21T11:00:00Z", "cluster": "\\ud800"}',
    "[1, 2, 3]",
    "null",
    '{"schema_version": 1,',
]


@pytest.mark.parametrize("message", HOSTILE)
def test_hostile_messages_are_refused_by_both_paths(message: Any) -> None:
    assert check(message) is None
    raw = message if isinstance(message, str) else json.dumps(message, allow_nan=True)
    with pytest.raises(ContractError):
        stage_row(raw.encode())


def test_where_the_fast_path_declines_pydantic_still_accepts() -> None:
    # Forms outside the fast path's plain RFC 3339 subset are valid and must not be lost.
    for time in ("2026-11-21 11:00:00Z", "2026-11-21T11:00Z", "2026-11-21T11:00:00.9999996Z"):
        raw = json.dumps({**GOOD, "time": time}).encode()
        assert FAST_SAMPLE.decode(raw) is None
        assert stage_row(raw) == sample_row(parse_sample(raw))


ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=300)
    | st.sampled_from(["", "mock", "2026-11-21T11:00:00Z", "2026-11-21T11:00:00.1234567+01:00", UUID + "\n"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
FIELDS = st.sampled_from([*GpuSample.model_fields, "mig_profile", "x"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(FIELDS, ANY_JSON, max_size=4),
    drop=st.lists(st.sampled_from(list(GOOD)), max_size=2),
    metric=st.sampled_from(METRIC_FIELDS),
    number=st.integers(-(2**64), 2**64) | st.floats(),
)
def test_random_messages_never_pass_the_fast_path_alone(
    changes: dict[str, Any], drop: list[str], metric: str, number: float
) -> None:
    message = {**{k: v for k, v in GOOD.items() if k not in drop}, metric: number, **changes}
    check(message)


def test_the_compiler_refuses_what_it_cannot_translate() -> None:
    schema = GpuSample.model_json_schema()
    order = tuple(schema["properties"])
    bad = {
        **schema,
        "properties": {**schema["properties"], "gpu_index": {"type": "integer", "multipleOf": 2}},
    }
    with pytest.raises(SchemaNotSupportedError, match="multipleOf"):
        FastDecoder(bad, order, sane_time)
    with pytest.raises(SchemaNotSupportedError, match="closed objects"):
        FastDecoder({**schema, "additionalProperties": True}, order, sane_time)
    with pytest.raises(SchemaNotSupportedError, match="anchor"):
        python_pattern("^a$|^b$")
    assert python_pattern("^[a-z]*$") == "^[a-z]*\\Z"


def test_remembered_checks_never_pass_a_new_bad_value() -> None:
    for _ in range(3):  # the second and third time come from what the decoder remembers
        assert check(GOOD) is not None
        assert check({**GOOD, "hostname": "gpu-node-07\n"}) is None
        assert check({**GOOD, "time": "2026-11-21T11:00:00.123"}) is None


TEXT_FIELDS = [f for f, v in GOOD.items() if isinstance(v, str)] + [
    "pci_bus_id", "driver_version", "region", "pod", "namespace", "container",
]  # fmt: skip
# Every Unicode category, lone surrogates (Cs) and NUL included.
ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["\x00", "a\x00", "\ud800", "x\udfff", "\ud83d\ude00", "\ufeff", "\u2028", "\U0010ffff", " " * 300]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(TEXT_FIELDS), ANY_TEXT, min_size=1, max_size=3))
def test_any_text_in_any_string_field_gets_the_same_verdict_from_both_paths(changes: dict[str, str]) -> None:
    message = {**GOOD, **changes}
    stored = check(message)
    # as JSON carries it: an escaped high + low surrogate pair is one character, a lone one is not
    carried = [json.loads(json.dumps(t)) for t in changes.values()]
    storable = all("\x00" not in t and not any("\ud800" <= c <= "\udfff" for c in t) for t in carried)
    if not storable:  # what PostgreSQL cannot hold, neither path lets through
        assert stored is None
        assert pydantic_row(json.dumps(message).encode()) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(METRIC_FIELDS),
    number=st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2**63 - 1, 2**63, -0.0]
    ),
)
def test_huge_and_tiny_numbers_get_the_same_verdict_from_both_paths(field: str, number: float) -> None:
    check({**GOOD, field: number})


def test_a_message_longer_than_the_contract_allows_is_declined_by_the_fast_path() -> None:
    raw = GOOD_RAW[:-1] + b" " * MAX_RECORD_BYTES + b"}"  # valid JSON, but too long a record
    assert FAST_SAMPLE.decode(raw) is None
    assert FAST_SAMPLE.decode_many([GOOD_RAW, raw]) is None
    with pytest.raises(ContractError, match="exceeds"):
        stage_row(raw)


def with_value(field: str, text: str) -> bytes:
    """GOOD with `field` set to the JSON text given as is."""
    return json.dumps({**GOOD, field: "@@"}).replace('"@@"', text).encode()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(METRIC_FIELDS),
    sign=st.sampled_from(["", "-"]),
    whole=st.integers(0, 10**25).map(str) | st.sampled_from(["0", "00", "01"]),
    fraction=st.none() | st.text("0123456789", min_size=0, max_size=25),
    exponent=st.none()
    | st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 99)),
)
def test_any_number_text_gets_the_same_verdict_from_both_paths(
    field: str, sign: str, whole: str, fraction: str | None, exponent: tuple[str, str, int] | None
) -> None:
    text = sign + whole + ("" if fraction is None else "." + fraction)
    if exponent is not None:
        text += f"{exponent[0]}{exponent[1]}{exponent[2]}"
    check(with_value(field, text))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(GOOD_RAW)), st.sampled_from(["insert", "delete", "replace"]),
                  st.binary(min_size=1, max_size=3) | st.sampled_from([b'"', b"\\", b",", b"}", b"{", b"0"])),
        min_size=1, max_size=4,
    )
)  # fmt: skip
def test_bytes_changed_anywhere_get_the_same_verdict_from_both_paths(
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
    check(bytes(raw))

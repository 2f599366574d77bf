"""The contract is strict where the database is: version stated, details typed, text storable, bounded."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhealth.contract.jsonlimits import MAX_JSON_DEPTH, check_bounds
from gpuhealth.contract.wire_time import wire_time
from gpuhealth.gpu.driver_codes import ClockEventReason
from services.sink.rows import FAST_SAMPLE, stage_row
from shared.contract.event_details import DETAILS_BY_KIND, ThrottleReason
from shared.contract.models import (
    EventKind,
    GpuEvent,
    GpuSample,
    Source,
    parse_event,
    parse_sample,
)
from shared.contract.topic_registry import TopicSettings, json_schemas
from shared.plumbing.errors import ContractError

UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
SAMPLE: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-21T11:00:00.123Z", "source": "dcgm", "collector_id": "c1",
    "collection_latency_ms": 3.5, "gpu_uuid": UUID, "gpu_index": 0, "model": "NVIDIA H100 80GB HBM3",
    "hostname": "node-1", "cluster": "c", "datacenter": "d", "region": "r", "rack": "k", "job": "j",
    "pod": "p", "namespace": "n", "container": "o", "pci_bus_id": "00000000:3B:00.0", "driver_version": "550",
    "mig": [{"profile": "1g.10gb", "instance_id": 1}],
}  # fmt: skip
EVENT: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-21T11:00:00Z", "kind": "xid", "gpu_uuid": UUID,
    "hostname": "n1", "source": "mock", "collector_id": "c", "cluster": "c", "datacenter": "d", "rack": "r",
    "details": {"xid": 79},
}  # fmt: skip
# What the collector's event detector sends for each kind (services/collector/events.py).
DETAILS: dict[str, dict[str, Any]] = {
    "xid": {"xid": 79},
    "ecc_dbe": {"increment": 2, "total": 2},
    "row_remap_failure": {},
    "retirement_pending": {"pending": 3},
    "throttle_start": {"reasons": ["sw_thermal_slowdown", "hw_thermal_slowdown"]},
    "throttle_end": {"reasons": ["sw_power_cap"], "duration_s": 30.0},
    "gpu_lost": {"last_seen": "2026-11-21T10:59:50.123000+00:00"},
    "gpu_back": {},
}


def test_schema_version_is_required_on_the_wire_and_never_defaulted() -> None:
    for parse, message in ((parse_sample, SAMPLE), (parse_event, EVENT)):
        raw = json.dumps({k: v for k, v in message.items() if k != "schema_version"})
        with pytest.raises(ContractError, match="schema_version is required"):
            parse(raw)
        with pytest.raises(ContractError):
            parse(json.dumps({**message, "schema_version": None}))
    assert FAST_SAMPLE.decode(json.dumps({k: v for k, v in SAMPLE.items() if k != "schema_version"})) is None
    schemas = json_schemas()  # every topic's, from the registry (a dead letter's headers name theirs apart)
    for name in [m.schema for r in TopicSettings.registry() for m in r.topic.messages if m.part == "value"]:
        assert "schema_version" in schemas[name]["required"], name
        assert "default" not in schemas[name]["properties"]["schema_version"], name


def test_a_producer_building_a_message_in_python_states_the_version_it_writes() -> None:
    sample = parse_sample(json.dumps(SAMPLE))
    rebuilt = GpuSample(**{k: v for k, v in dict(sample).items() if k != "schema_version"})
    assert rebuilt.schema_version == 1
    assert json.loads(rebuilt.model_dump_json())["schema_version"] == 1


@pytest.mark.parametrize("kind", list(DETAILS))
def test_each_kind_takes_its_own_details_and_no_other(kind: str) -> None:
    assert parse_event(json.dumps({**EVENT, "kind": kind, "details": DETAILS[kind]})).details == DETAILS[kind]
    for other, details in DETAILS.items():
        if details != DETAILS[kind] and not (kind.startswith("throttle") and other.startswith("throttle")):
            with pytest.raises(ContractError, match="details"):
                parse_event(json.dumps({**EVENT, "kind": kind, "details": details}))
    with pytest.raises(ContractError, match="details"):
        parse_event(json.dumps({**EVENT, "kind": kind, "details": {**DETAILS[kind], "note": "free text"}}))


@pytest.mark.parametrize(
    "details",
    [
        {"xid": "79"}, {"xid": 79.0}, {"xid": True}, {"xid": 0}, {"xid": None}, {"xid": [79]},
        {"xid": 79, "extra": "\x00"}, {"xid": 2**70},
    ],
)  # fmt: skip
def test_xid_details_are_one_whole_code(details: dict[str, Any]) -> None:
    with pytest.raises(ContractError):
        parse_event(json.dumps({**EVENT, "details": details}))


@settings(max_examples=200, deadline=None)
@given(
    count=st.one_of(st.integers(-3, 2**40), st.booleans(), st.floats(allow_nan=False), st.text(max_size=5)),
    last_ms=st.one_of(st.integers(-(10**7), 10**7), st.text(max_size=30)),
)
def test_a_folded_xid_counts_at_least_one_line_up_to_a_last_not_before_its_first(
    count: Any, last_ms: Any
) -> None:
    """details.count and .last (collector/xid_fold.py): whole lines, a time at or after the event's."""
    first = datetime(2026, 11, 21, 11, 0, tzinfo=UTC)
    last = last_ms if isinstance(last_ms, str) else wire_time(first + timedelta(milliseconds=last_ms))
    raw = json.dumps({**EVENT, "details": {"xid": 95, "count": count, "last": last}})
    good = (
        type(count) is int and 1 <= count <= 2**31 - 1
        and not isinstance(last_ms, str) and last_ms >= 0
    )  # fmt: skip
    if not good:
        with pytest.raises(ContractError, match="details"):
            parse_event(raw)
        return
    event = parse_event(raw)
    assert (event.details["count"], event.details["last"]) == (count, last)


def test_every_kind_has_a_shape_and_the_schema_says_which() -> None:
    assert set(DETAILS_BY_KIND) == {k.value for k in EventKind} == set(DETAILS)
    kinds = [
        rule["if"]["properties"]["kind"]["const"]
        for rule in json_schemas()["gpu-event.v1.schema.json"]["allOf"]
    ]
    assert sorted(kinds) == sorted(DETAILS)
    assert set(ThrottleReason.__args__) == {str(r.name).lower() for r in ClockEventReason}  # type: ignore[attr-defined]


def test_details_are_normalised_to_their_kinds_types() -> None:
    event = GpuEvent(
        time=datetime(2026, 11, 21, tzinfo=UTC), kind=EventKind.THROTTLE_END, gpu_uuid=UUID, hostname="n",
        source=Source.MOCK, collector_id="c", details={"reasons": ["sw_power_cap"], "duration_s": 30},
    )  # fmt: skip
    assert event.details == {"reasons": ["sw_power_cap"], "duration_s": 30.0}
    assert type(event.details["duration_s"]) is float
    assert parse_event(event.model_dump_json()) == event


# Every string of each contract, and where it sits.
SAMPLE_TEXT = [k for k, v in SAMPLE.items() if isinstance(v, str)] + ["mig.profile"]
EVENT_TEXT = [k for k, v in EVENT.items() if isinstance(v, str)] + ["details.last_seen", "details.reasons"]
UNSTORABLE = st.sampled_from(["\x00", "\ud800", "\udfff", "\udc00\ud800"])


def put(message: dict[str, Any], where: str, text: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(message))
    if where == "mig.profile":
        out["mig"][0]["profile"] = text
    elif where == "details.last_seen":
        out["kind"], out["details"] = "gpu_lost", {"last_seen": text}
    elif where == "details.reasons":
        out["kind"], out["details"] = "throttle_start", {"reasons": [text]}
    else:
        out[where] = text
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(SAMPLE_TEXT + EVENT_TEXT),
    before=st.text(max_size=20),
    bad=UNSTORABLE,
    after=st.text(max_size=20),
)
def test_text_postgresql_cannot_store_is_refused_in_every_string_field(
    field: str, before: str, bad: str, after: str
) -> None:
    is_sample = field in SAMPLE_TEXT
    message = put(SAMPLE if is_sample else EVENT, field, before + bad + after)
    raw = json.dumps(message)  # NUL and lone surrogates as \\u escapes, as a hostile producer writes them
    with pytest.raises(ContractError):
        (parse_sample if is_sample else parse_event)(raw)
    if is_sample:
        assert FAST_SAMPLE.decode(raw) is None
        with pytest.raises(ContractError):
            stage_row(raw.encode())


def test_a_model_built_in_python_refuses_unstorable_text_too() -> None:
    good = parse_sample(json.dumps(SAMPLE))
    for bad in ("a\x00b", "a\ud800b"):
        with pytest.raises(ValueError, match="hostname"):
            GpuSample(**{**dict(good), "hostname": bad})


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ax\x00'), max_size=8)
NESTED = st.recursive(
    st.none() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=NESTED, limit=st.integers(1, 8))
def test_the_depth_bound_counts_nesting_and_never_brackets_inside_strings(value: Any, limit: int) -> None:
    raw = json.dumps(value)
    if depth_of(value) > limit:
        with pytest.raises(ContractError, match="nested deeper"):
            check_bounds(raw, max_depth=limit)
    else:
        check_bounds(raw, max_depth=limit)
        check_bounds(raw.encode(), max_depth=limit)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_refused_before_any_parser_recurses(depth: int) -> None:
    raw = '{"schema_version": 1, "gpu_uuid": ' + "[" * depth + "]" * depth + "}"
    for parse in (parse_sample, parse_event, stage_row):
        with pytest.raises(ContractError, match="nested deeper"):
            parse(raw.encode())


def test_records_over_the_size_bound_are_refused_before_parsing() -> None:
    raw = json.dumps({**SAMPLE, "hostname": "x" * 1_000_001})
    with pytest.raises(ContractError, match="exceeds"):
        parse_sample(raw)
    check_bounds(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=400) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes_are_refused_with_a_contract_error_and_nothing_else(raw: bytes) -> None:
    for parse in (parse_sample, parse_event, stage_row):
        with pytest.raises(ContractError):
            parse(raw)

"""The chain's canonical bytes and its verification, on made-up and hostile records (hypothesis too)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.verifier.chainlog import MemoryChain
from shared.contract.chain import (
    GENESIS,
    ChainEntry,
    canonical_bytes,
    link_of,
    parse_canonical_input,
    verify_chain,
)
from shared.contract.models_verify import (
    Outcome,
    RecordKind,
    VerificationRecord,
    parse_verification,
    record_bytes,
)
from shared.plumbing.errors import ContractError
from tests.helpers.verifier_fakes import UUIDS


def fields(gpu: str = UUIDS[0], **extra: Any) -> dict[str, Any]:
    return {
        "kind": RecordKind.COMPUTE_CHECK, "gpu_uuid": gpu, "hostname": "node-1", "verifier_id": "node-1",
        "name": "matmul", "device": "cuda:0", "outcome": Outcome.PASS, "device_ms": 0.35, "cpu_ms": 15.0,
        "speedup": 42.9, "input_shape": [2000, 2000, 2000], "dtype": "float32", **extra,
    }  # fmt: skip


def chain_of(n_per_gpu: list[int]) -> MemoryChain:
    chain = MemoryChain()
    for round_ in range(max(n_per_gpu, default=0)):
        for gpu, n in zip(UUIDS, n_per_gpu, strict=False):
            if round_ < n:
                chain.append(fields(gpu, name=f"op-{round_}"))
    return chain


def test_canonical_bytes_are_sorted_compact_utf8() -> None:
    assert (
        canonical_bytes({"b": 1, "a": [1.5, "é", None, True]}) == '{"a":[1.5,"é",null,true],"b":1}'.encode()
    )
    assert link_of({"a": 1}) == link_of(json.loads('{ "a" : 1 }'))  # whitespace is not content


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'"x"', b"\xff", b'{"a":NaN}', b'{"a":Infinity}', b'{"a":1,"a":2}', b"[" * 100_000],
)
def test_what_is_not_a_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(ContractError):
        parse_canonical_input(raw)


def test_a_lone_surrogate_has_no_canonical_form_and_is_a_broken_link_not_a_crash() -> None:
    raw = b'{"gpu_uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "\\ud800"}'
    with pytest.raises(ContractError, match="canonically"):
        link_of(parse_canonical_input(raw))
    report = verify_chain([ChainEntry(0, 0, UUIDS[0].encode(), raw)])
    assert report.first_broken is not None
    assert "canonically" in report.first_broken.reason


def test_records_chain_per_gpu_from_genesis() -> None:
    chain = chain_of([3, 2])
    a0, b0, a1, _b1, a2 = chain.records
    assert (a0.seq, a0.prev_sha256) == (0, GENESIS)
    assert (b0.seq, b0.prev_sha256) == (0, GENESIS)
    assert a1.prev_sha256 == link_of(json.loads(record_bytes(a0)))
    assert a2.seq == 2
    report = verify_chain(chain.entries())
    assert report.intact
    assert report.records == 5
    assert {u: h.seq for u, h in report.heads.items()} == {UUIDS[0]: 2, UUIDS[1]: 1}


def _tampered(entries: list[ChainEntry], index: int, change: dict[str, Any]) -> list[ChainEntry]:
    value = {**json.loads(entries[index].value or b"{}"), **change}
    out = list(entries)
    out[index] = ChainEntry(
        entries[index].partition, entries[index].offset, entries[index].key, json.dumps(value).encode()
    )
    return out


def test_a_changed_record_breaks_the_next_link() -> None:
    entries = chain_of([4]).entries()
    report = verify_chain(_tampered(entries, 1, {"outcome": "pass", "speedup": 99.0}))
    assert not report.intact
    assert report.first_broken is not None
    assert report.first_broken.offset == 2
    assert "a record was changed, removed or inserted" in report.first_broken.reason


@pytest.mark.parametrize(
    ("mutate", "offset", "reason"),
    [
        (lambda e: e[:1] + e[2:], 2, "does not match the previous record"),  # one removed
        (lambda e: e[1:], 1, "not at its genesis"),  # the first removed
        (lambda e: [*e, e[2]], 2, "does not match"),  # replayed at the end
        (
            lambda e: [*e[:3], ChainEntry(0, 99, b"GPU-other-uuid-123", e[3].value)],
            99,
            "is not the record's gpu_uuid",
        ),
        (lambda e: [*e[:3], ChainEntry(0, 3, e[3].key, b"not json")], 3, "not JSON"),
        (lambda e: [*e[:3], ChainEntry(0, 3, e[3].key, None)], 3, "no value"),
    ],
)
def test_removed_replayed_misfiled_and_garbage_records_are_reported(
    mutate: Any, offset: int, reason: str
) -> None:
    report = verify_chain(mutate(chain_of([4]).entries()))
    assert report.first_broken is not None
    assert report.first_broken.offset == offset
    assert reason in report.first_broken.reason


def test_a_forged_record_with_the_right_link_but_wrong_seq_is_caught() -> None:
    entries = chain_of([2]).entries()
    head = json.loads(entries[1].value or b"{}")
    forged = {**head, "seq": 5, "prev_sha256": link_of(head)}
    report = verify_chain([*entries, ChainEntry(0, 2, entries[1].key, json.dumps(forged).encode())])
    assert report.first_broken is not None
    assert "seq 5 does not follow seq 1" in report.first_broken.reason


def test_a_later_break_is_reported_too_not_only_the_first() -> None:
    entries = chain_of([6]).entries()
    report = verify_chain(_tampered(_tampered(entries, 4, {"name": "x"}), 1, {"name": "y"}))
    assert [b.offset for b in report.broken] == [2, 5]


def test_partitions_grown_mid_chain_are_followed_by_seq() -> None:
    entries = chain_of([4]).entries()
    moved = [*(ChainEntry(1, i, e.key, e.value) for i, e in enumerate(entries[2:])), *entries[:2]]
    assert verify_chain(moved).intact


# ---------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=8))
def test_canonical_form_is_a_fixed_point_of_parsing(value: dict[str, Any]) -> None:
    once = canonical_bytes(value)
    assert canonical_bytes(parse_canonical_input(once)) == once
    assert link_of(parse_canonical_input(json.dumps(value, indent=2, sort_keys=False))) == link_of(value)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_record_parser(raw: bytes) -> None:
    outcome: Any
    try:
        outcome = parse_verification(raw)
    except ContractError as e:
        outcome = e
    assert isinstance(outcome, ContractError)
    assert str(outcome)


@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4), st.data())
@settings(max_examples=60, deadline=None)
def test_any_single_change_to_a_chained_record_is_detected(sizes: list[int], data: st.DataObject) -> None:
    chain = chain_of([n + 2 for n in sizes])  # at least two records per GPU, so every record has a successor
    entries = chain.entries()
    gpu_entries = [i for i, e in enumerate(entries) if e.key == entries[0].key]
    index = data.draw(st.sampled_from(gpu_entries[:-1]))
    key = data.draw(st.sampled_from(["name", "device_ms", "outcome", "hostname", "time"]))
    original = json.loads(entries[index].value or b"{}")
    new = data.draw(st.sampled_from(["tampered", 1.0, "error", "2026-01-01T00:00:00.000Z"]))
    if original[key] == new:
        new = "something else"
    report = verify_chain(_tampered(entries, index, {key: new}))
    following = gpu_entries[gpu_entries.index(index) + 1]
    assert report.first_broken is not None
    assert report.first_broken.offset == entries[following].offset


@given(
    st.lists(st.tuples(st.binary(max_size=40) | st.none(), st.binary(max_size=200) | st.none()), max_size=20)
)
def test_verify_chain_survives_any_topic_content(messages: list[tuple[bytes | None, bytes | None]]) -> None:
    entries = [ChainEntry(0, i, key, value) for i, (key, value) in enumerate(messages)]
    report = verify_chain(entries)
    assert report.records == len(entries)
    assert len(report.broken) <= len(entries)


@given(
    st.sampled_from(sorted(VerificationRecord.model_fields)),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30) | st.lists(st.integers()),
)
@settings(max_examples=300)
def test_a_record_with_any_field_replaced_parses_or_is_refused_with_the_field_named(
    field: str, value: Any
) -> None:
    good = json.loads(record_bytes(chain_of([1]).records[0]))
    try:
        raw = json.dumps({**good, field: value})
    except ValueError:  # NaN/inf: json.dumps writes them only with allow_nan, which the parser refuses anyway
        raw = json.dumps({**good, field: value}, allow_nan=True)
    outcome: Any
    try:
        outcome = parse_verification(raw)
    except ContractError as e:
        outcome = str(e)
    if isinstance(outcome, str):
        assert field in outcome or "schema_version" in outcome or "JSON constant" in outcome, outcome
    else:
        assert getattr(outcome, field) is not None or value is None

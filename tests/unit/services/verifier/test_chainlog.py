"""The audit chain under attack: a record changed, removed, truncated, reordered, duplicated, forked or
forged, and hostile topic content (hypothesis). Records come from the verifier's own MemoryChain.

The chain is keyless: each link is the SHA-256 of the previous record's canonical bytes, with no secret in
it. So what a key would add is not here: whoever can write the topic can write a whole new chain that
verifies. What the chain does catch is any change to a record that others followed, and the head's hash
moves with every rewrite, so a head anchored elsewhere (the sink's table, an operator's note) catches a
rewritten history too: the last tests show both.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.verifier.chainlog import MemoryChain
from shared.contract.chain import GENESIS, ChainEntry, ChainHead, link_of, verify_chain
from shared.contract.models_verify import Outcome, RecordKind
from tests.helpers.verifier_fakes import UUIDS

A, B = UUIDS


def fields(gpu: str, name: str) -> dict[str, Any]:
    return {
        "kind": RecordKind.COMPUTE_CHECK,
        "gpu_uuid": gpu,
        "hostname": "node-1",
        "verifier_id": "node-1",
        "name": name,
        "device": "cuda:0",
        "outcome": Outcome.PASS,
        "device_ms": 0.35,
        "cpu_ms": 15.0,
        "speedup": 42.9,
    }


def entries_of(n: int, gpu: str = A) -> list[ChainEntry]:
    """A chain of `n` records of one GPU, made once: an example is the same when hypothesis replays it."""
    return list(_chain_of(n, gpu))


@functools.cache
def _chain_of(n: int, gpu: str) -> tuple[ChainEntry, ...]:
    chain = MemoryChain()
    for i in range(n):
        chain.append(fields(gpu, f"op-{i}"))
    return tuple(chain.entries())


def renumbered(entries: list[ChainEntry]) -> list[ChainEntry]:
    """The same records at consecutive offsets, as a topic rewritten in this order would hold them."""
    return [ChainEntry(0, i, e.key, e.value) for i, e in enumerate(entries)]


def value_of(entry: ChainEntry) -> dict[str, Any]:
    return dict(json.loads(entry.value or b"{}"))


def reasons(entries: list[ChainEntry]) -> list[str]:
    return [b.reason for b in verify_chain(entries).broken]


# ---------------------------------------------------------------- truncation


def test_a_truncated_head_leaves_an_intact_chain_whose_head_moved_back() -> None:
    entries = entries_of(5)
    head = verify_chain(entries).heads[A]
    cut = verify_chain(entries[:3])
    assert cut.intact  # the chain alone cannot see that its newest records are gone...
    assert (cut.heads[A].seq, head.seq) == (2, 4)
    assert cut.heads[A].sha256 != head.sha256  # ...a head anchored elsewhere can


def test_a_truncated_start_is_no_genesis() -> None:
    report = verify_chain(renumbered(entries_of(5)[2:]))
    assert report.first_broken is not None
    assert report.first_broken.offset == 0
    assert "not at its genesis record" in report.first_broken.reason
    assert len(report.broken) == 1  # the rest follows the first record it has


def test_a_chain_cut_in_the_middle_is_broken_where_it_resumes() -> None:
    entries = entries_of(6)
    report = verify_chain(renumbered(entries[:2] + entries[4:]))
    assert [b.offset for b in report.broken] == [2]
    assert "does not match the previous record's hash" in report.broken[0].reason


# ---------------------------------------------------------------- reordering and duplicates


def test_two_records_swapped_break_both_links() -> None:
    e = entries_of(5)
    report = verify_chain(renumbered([e[0], e[2], e[1], e[3], e[4]]))
    assert [b.offset for b in report.broken] == [1, 2, 3]


def test_a_duplicated_record_is_broken_at_the_copy_alone() -> None:
    """The copy's link is its original's, so the record after it still follows: one break, not two."""
    e = entries_of(4)
    report = verify_chain(renumbered([e[0], e[1], e[1], e[2], e[3]]))
    assert [b.offset for b in report.broken] == [2]
    assert "does not match" in report.broken[0].reason
    assert report.heads[A].seq == 3


def test_a_fork_two_writers_from_one_head_is_a_broken_link() -> None:
    chain = MemoryChain()
    for i in range(2):
        chain.append(fields(A, f"op-{i}"))
    other = MemoryChain(dict(chain.heads))  # a second writer that read the same head
    chain.append(fields(A, "mine"))
    other.append(fields(A, "theirs"))
    entries = renumbered([*chain.entries(), *other.entries()])
    assert [b.offset for b in verify_chain(entries).broken] == [3]


def test_other_gpus_records_between_do_not_matter() -> None:
    chain = MemoryChain()
    for i in range(4):
        chain.append(fields(A, f"a-{i}"))
        chain.append(fields(B, f"b-{i}"))
    report = verify_chain(chain.entries())
    assert report.intact
    assert {u: h.seq for u, h in report.heads.items()} == {A: 3, B: 3}


def test_a_record_moved_to_another_gpus_key_is_refused_and_both_chains_notice() -> None:
    chain = MemoryChain()
    for i in range(3):
        chain.append(fields(A, f"a-{i}"))
    entries = chain.entries()
    moved = [entries[0], ChainEntry(0, 1, B.encode(), entries[1].value), entries[2]]
    assert reasons(moved) == [
        f"message key {B!r} is not the record's gpu_uuid {A!r}",
        reasons(renumbered([entries[0], entries[2]]))[0],
    ]


# ---------------------------------------------------------------- tampering and forgery


@pytest.mark.parametrize(
    "change",
    [
        {"outcome": "fail"},
        {"speedup": 42.900000001},
        {"name": "op-1 "},
        {"extra": None},  # a field added, even a null one
        {"hostname": "node-1".upper()},
    ],
)
def test_any_change_to_a_followed_record_breaks_the_next_link(change: dict[str, Any]) -> None:
    e = entries_of(3)
    tampered = ChainEntry(0, 1, e[1].key, json.dumps({**value_of(e[1]), **change}).encode())
    assert [b.offset for b in verify_chain([e[0], tampered, e[2]]).broken] == [2]


def test_a_field_removed_breaks_the_next_link() -> None:
    e = entries_of(3)
    value = value_of(e[1])
    del value["cpu_ms"]
    assert [
        b.offset
        for b in verify_chain([e[0], ChainEntry(0, 1, e[1].key, json.dumps(value).encode()), e[2]]).broken
    ] == [2]


def test_spacing_and_key_order_are_not_content() -> None:
    e = entries_of(3)
    respaced = json.dumps(dict(reversed(list(value_of(e[1]).items()))), indent=3).encode()
    assert verify_chain([e[0], ChainEntry(0, 1, e[1].key, respaced), e[2]]).intact


def test_a_rewritten_history_verifies_but_its_head_differs_from_the_anchored_one() -> None:
    """No key: a forger who rewrites a record and relinks everything after it has a chain that verifies.
    The head's hash is what gives it away, against a copy kept elsewhere (the sink's table)."""
    e = entries_of(4)
    anchored = verify_chain(e).heads[A]
    values = [value_of(x) for x in e]
    values[1]["outcome"] = "fail"
    for i in range(2, len(values)):
        values[i]["prev_sha256"] = link_of(values[i - 1])
    forged = [ChainEntry(0, i, A.encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    report = verify_chain(forged)
    assert report.intact
    assert report.heads[A].seq == anchored.seq
    assert report.heads[A].sha256 != anchored.sha256


def test_appending_after_a_known_head_continues_its_chain() -> None:
    """A writer that starts from heads read off the topic (KafkaChain) links to them."""
    first = MemoryChain()
    for i in range(2):
        first.append(fields(A, f"op-{i}"))
    later = MemoryChain(dict(first.heads))
    record = later.append(fields(A, "op-2"))
    assert (record.seq, record.prev_sha256) == (2, first.heads[A].sha256)
    entries = renumbered([*first.entries(), *later.entries()])
    assert verify_chain(entries).intact


def test_a_chain_starting_from_no_head_starts_at_genesis() -> None:
    record = MemoryChain({B: ChainHead(7, "f" * 64, 0, 7)}).append(fields(A, "op"))
    assert (record.seq, record.prev_sha256) == (0, GENESIS)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"seq": -1}, "seq -1 is not a non-negative integer"),
        ({"seq": True}, "seq True is not a non-negative integer"),
        ({"seq": 1.0}, "seq 1.0 is not a non-negative integer"),
        ({"seq": "1"}, "seq '1' is not a non-negative integer"),
        ({"prev_sha256": "A" * 64}, "is not 64 lowercase hex digits"),
        ({"prev_sha256": "0" * 63}, "is not 64 lowercase hex digits"),
        ({"prev_sha256": None}, "is not 64 lowercase hex digits"),
        ({"gpu_uuid": ""}, "record has no gpu_uuid"),
        ({"gpu_uuid": 7}, "record has no gpu_uuid"),
    ],
)
def test_chain_fields_of_the_wrong_kind_are_named(change: dict[str, Any], reason: str) -> None:
    e = entries_of(2)
    bad = ChainEntry(0, 1, e[1].key, json.dumps({**value_of(e[1]), **change}).encode())
    report = verify_chain([e[0], bad])
    assert report.first_broken is not None
    assert report.first_broken.offset == 1
    assert reason in report.first_broken.reason


def test_a_record_without_a_key_is_named_by_its_uuid() -> None:
    e = entries_of(1)
    report = verify_chain([ChainEntry(0, 0, None, e[0].value)])
    assert report.first_broken is not None
    assert report.first_broken.gpu_uuid == A
    assert "message key None" in report.first_broken.reason


# ---------------------------------------------------------------- properties


@given(st.integers(min_value=2, max_value=8), st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_reordering_of_a_gpus_records_is_detected(n: int, data: st.DataObject) -> None:
    e = entries_of(n)
    order = data.draw(st.permutations(range(n)))
    if list(order) == list(range(n)):
        return
    assert not verify_chain(renumbered([e[i] for i in order])).intact


@given(st.integers(min_value=1, max_value=8), st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_removal_but_the_newest_records_is_detected(n: int, data: st.DataObject) -> None:
    e = entries_of(n)
    removed = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1))
    kept = [x for i, x in enumerate(e) if i not in removed]
    report = verify_chain(renumbered(kept))
    if removed == set(range(n - len(removed), n)):  # only the newest: a truncation, seen by the head alone
        assert report.intact
        assert not kept or report.heads[A].seq == len(kept) - 1
    else:
        assert not report.intact


@given(st.integers(min_value=1, max_value=6), st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_duplicated_record_is_detected(n: int, data: st.DataObject) -> None:
    e = entries_of(n)
    copied = data.draw(st.integers(min_value=0, max_value=n - 1))
    at = data.draw(st.integers(min_value=0, max_value=n))
    assert not verify_chain(renumbered([*e[:at], e[copied], *e[at:]])).intact


@given(st.integers(min_value=2, max_value=6), st.data())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_flipped_byte_of_a_followed_record_is_detected_or_refused(n: int, data: st.DataObject) -> None:
    e = entries_of(n)
    index = data.draw(st.integers(min_value=0, max_value=n - 2))
    raw = bytearray(e[index].value or b"")
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    tampered = [*e[:index], ChainEntry(0, index, e[index].key, bytes(raw)), *e[index + 1 :]]
    report = verify_chain(tampered)
    try:
        unchanged = json.loads(bytes(raw)) == value_of(e[index])
    except ValueError:
        unchanged = False
    if unchanged:  # the same content spelt otherwise (`1e-07` as `1E-07`) is the same record
        assert report.intact
    else:
        assert not report.intact


hostile_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.sampled_from(["seq", "prev_sha256", "gpu_uuid"]),
    hostile_values,
    st.booleans(),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hostile_chain_fields_never_crash_the_audit(field: str, value: Any, keyed: bool) -> None:
    e = entries_of(2)
    record = {**value_of(e[1]), field: value}
    raw = json.dumps(record, allow_nan=True).encode()
    report = verify_chain([e[0], ChainEntry(0, 1, e[1].key if keyed else None, raw)])
    assert report.records == 2
    assert len(report.broken) <= 2
    assert all(b.describe() for b in report.broken)


@given(st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=12))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_interleaved_gpus_chain_independently(order: list[str]) -> None:
    chain = MemoryChain()
    for i, who in enumerate(order):
        chain.append(fields(A if who == "a" else B, f"op-{i}"))
    report = verify_chain(chain.entries())
    assert report.intact
    assert sum(h.seq + 1 for h in report.heads.values()) == len(order)

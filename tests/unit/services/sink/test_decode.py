"""The sink's decode step on hand-made messages: what is stored, what is dead-lettered, and why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from services.sink.decode import Decoded, _decode_one, decode_lanes
from shared.settings.common import TopicSettings

TOPICS = TopicSettings(metrics_raw="raw", events="events")
UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
GOOD = {
    "schema_version": 1, "time": "2026-11-21T11:00:00.123Z", "source": "mock", "collector_id": "c",
    "collection_latency_ms": 1.0, "gpu_uuid": UUID, "gpu_index": 0, "model": "H100", "hostname": "n1",
}  # fmt: skip
EVENT = {
    "schema_version": 1, "time": "2026-11-21T11:00:00Z", "kind": "xid", "gpu_uuid": UUID,
    "hostname": "n1", "source": "mock", "collector_id": "c", "details": {"xid": 79},
}  # fmt: skip


class Msg:
    def __init__(self, topic: str, offset: int, value: bytes | None, key: bytes | None = UUID.encode(),
                 partition: int = 0, error: Any = None) -> None:  # fmt: skip
        self._t, self._o, self._v, self._k, self._p, self._e = (
            topic,
            offset,
            value,
            key,
            partition,
            error,
        )

    def topic(self) -> str:
        return self._t

    def offset(self) -> int:
        return self._o

    def partition(self) -> int:
        return self._p

    def value(self) -> bytes | None:
        return self._v

    def key(self) -> bytes | None:
        return self._k

    def error(self) -> Any:
        return self._e


def test_valid_samples_and_events_are_batched_with_next_offsets() -> None:
    out = decode_lanes(
        [
            Msg("raw", 10, json.dumps(GOOD).encode()),
            Msg(
                "raw",
                11,
                json.dumps({**GOOD, "time": "2026-11-21T11:00:10Z"}).encode(),
                partition=0,
            ),
            Msg("raw", 4, json.dumps(GOOD).encode(), partition=3),
            Msg("events", 7, json.dumps(EVENT).encode()),
        ],
        TOPICS,
        10_000,
    )[0]
    assert len(out.batch.rows) == 3
    assert len(out.batch.events) == 1
    assert out.dead == []
    assert out.batch.next_offsets == {("raw", 0): 12, ("raw", 3): 5, ("events", 0): 8}


def test_bad_records_are_dead_lettered_with_reasons_and_still_advance_offsets() -> None:
    msgs = [
        Msg("raw", 0, b"{oops"),
        Msg(
            "raw",
            1,
            json.dumps({**GOOD, "gpu_temp_c": float("inf")}).replace("Infinity", "1e999").encode(),
        ),
        Msg("raw", 2, None),
        Msg("raw", 3, b"x" * 20_000),
        Msg("raw", 4, json.dumps(GOOD).encode(), key=b"GPU-other"),
        Msg("elsewhere", 5, json.dumps(GOOD).encode()),
        Msg("events", 6, json.dumps({**EVENT, "kind": "meteor"}).encode()),
        Msg("raw", 7, json.dumps(GOOD).encode()),
    ]
    out = decode_lanes(msgs, TOPICS, 10_000)[0]
    assert [(d.offset, d.category) for d in out.dead] == [
        (0, "contract"), (1, "contract"), (2, "empty"), (3, "oversized"),
        (4, "key"), (5, "topic"), (6, "contract"),
    ]  # fmt: skip
    assert "gpu_temp_c" in out.dead[1].reason
    assert "kind" in out.dead[6].reason
    assert len(out.batch.rows) == 1  # the valid one behind them all
    assert out.batch.next_offsets[("raw", 0)] == 8
    headers = dict(out.dead[0].headers())
    assert headers["dlq.source.topic"] == b"raw"
    assert headers["dlq.source.offset"] == b"0"


def test_consumer_errors_are_not_records() -> None:
    assert decode_lanes([Msg("raw", 0, None, error="transport")], TOPICS, 10_000) == {}


def test_lanes_split_by_partition_each_with_its_own_offsets_and_dead_letters() -> None:
    msgs = [Msg("raw", 10 + p, json.dumps(GOOD).encode(), partition=p) for p in range(4)]
    msgs.append(Msg("raw", 20, b"{oops", partition=3))
    lanes = decode_lanes(msgs, TOPICS, 10_000, lanes=2)
    assert sorted(lanes) == [0, 1]
    assert lanes[0].batch.next_offsets == {("raw", 0): 11, ("raw", 2): 13}
    assert lanes[1].batch.next_offsets == {("raw", 1): 12, ("raw", 3): 21}
    assert [len(lanes[n].batch.rows) for n in (0, 1)] == [2, 2]
    assert (lanes[0].dead, [d.offset for d in lanes[1].dead]) == ([], [20])
    assert [lanes[n].consumed for n in (0, 1)] == [2, 3]


def test_any_exception_while_decoding_refuses_that_record_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import services.sink.decode as decode_module
    from services.sink.rows import stage_row as real

    def fragile(raw: bytes | str) -> Any:
        if b"boom" in (raw if isinstance(raw, bytes) else raw.encode()):
            raise RecursionError("maximum recursion depth exceeded")
        return real(raw)

    def fragile_at_once(raws: list[bytes]) -> Any:
        if any(b"boom" in raw for raw in raws):
            raise RecursionError("maximum recursion depth exceeded")
        raise AssertionError("the lane holds the fragile record")

    monkeypatch.setattr(decode_module, "stage_row", fragile)
    monkeypatch.setattr(decode_module, "stage_rows", fragile_at_once)
    msgs = [
        Msg("raw", 0, json.dumps(GOOD).encode()),
        Msg("raw", 1, json.dumps({**GOOD, "hostname": "boom"}).encode()),
        Msg("raw", 2, json.dumps({**GOOD, "time": "2026-11-21T11:00:10Z"}).encode()),
        Msg("events", 3, b'{"schema_version": 1, "details": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ]
    out = decode_lanes(msgs, TOPICS, 100_000)[0]
    assert [(d.offset, d.category) for d in out.dead] == [(1, "decode"), (3, "contract")]
    assert "RecursionError" in out.dead[0].reason
    assert "nested deeper" in out.dead[1].reason
    assert len(out.batch.rows) == 2
    assert [o[2] for o in out.batch.row_origins] == [0, 2]  # each stored row knows where it came from
    assert out.batch.next_offsets == {("raw", 0): 3, ("events", 0): 4}


# Records of every kind the sink can meet, good and bad, for the property below.
OTHER_UUID = "GPU-0a0b0c0d-0000-4000-8000-000000000001"


def raw(t: str, key: bytes | None = UUID.encode(), tail: bytes = b"", **changes: Any) -> Msg:
    """A gpu-metrics-raw record of GOOD at time t, with changes."""
    return Msg("raw", 0, json.dumps({**GOOD, "time": t, **changes}).encode() + tail, key=key)


RECORDS = [
    lambda t: raw(t),
    lambda t: raw(t, key=None),
    lambda t: raw(t, key=OTHER_UUID.encode(), gpu_uuid=OTHER_UUID),
    lambda t: raw(t, mig=[{"profile": "1g.10gb", "instance_id": 1}]),
    lambda t: raw(t, hostname="bad\u0007host"),  # a pattern
    lambda t: raw(t, gpu_temp_c=-500),  # a bound
    lambda t: raw(t, key=OTHER_UUID.encode()),  # the key
    lambda t: raw(t.replace("Z", "+00:00")),
    lambda t: raw(t + " "),  # pydantic decides
    lambda t: Msg("raw", 0, b'{"a": 1},{"b": 2}'),
    lambda t: Msg("raw", 0, b""),
    lambda t: Msg("raw", 0, None),
    lambda t: Msg("raw", 0, b"[" * 100 + b"]" * 100),
    lambda t: Msg("raw", 0, b"x" * 20_000),
    lambda t: raw(t, tail=b" " * 10_000),  # valid, too large
    lambda t: Msg("raw", 0, None, error="transport"),
    lambda t: Msg("events", 0, json.dumps({**EVENT, "time": t}).encode()),
    lambda t: Msg("events", 0, json.dumps({**EVENT, "kind": "meteor"}).encode()),
    lambda t: Msg("elsewhere", 0, json.dumps(GOOD).encode()),
]


def comparable(decoded: Decoded) -> tuple[Any, ...]:
    """A batch in a form == compares by value (Jsonb compares by identity)."""
    batch = decoded.batch
    rows = [tuple(v.obj if isinstance(v, Jsonb) else v for v in row) for row in batch.rows]
    dead = [(d.key, d.value, d.topic, d.partition, d.offset, d.category, d.reason) for d in batch.dead]
    return (decoded.consumed, rows, batch.row_origins, batch.events, batch.event_origins, dead,
            batch.next_offsets, batch.frontiers)  # fmt: skip


GOOD_KINDS = 4  # the first RECORDS are valid samples


def picks(kinds: int) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    """(kind, partition, second) of records drawn from the first `kinds` of RECORDS."""
    return st.lists(st.tuples(st.integers(0, kinds - 1), st.integers(0, 3), st.integers(0, 59)), max_size=30)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    good=picks(GOOD_KINDS),
    bad=picks(len(RECORDS)).map(lambda p: p[:2]),  # mostly good lanes with a stray bad record
    at=st.integers(0, 30),
    lanes=st.integers(1, 3),
)
def test_decoding_a_lane_at_once_gives_what_decoding_each_record_gives(
    good: list[tuple[int, int, int]], bad: list[tuple[int, int, int]], at: int, lanes: int
) -> None:
    """Whatever the mix, the batch is the one a record-by-record decode builds: same rows and
    origins, same dead letters with the same reasons, same offsets."""
    msgs = []
    for offset, (kind, partition, second) in enumerate(good[:at] + bad + good[at:]):
        msg = RECORDS[kind](f"2026-11-21T11:00:{second:02d}Z")
        msg._o, msg._p = offset, partition
        msgs.append(msg)
    expected: dict[int, Decoded] = {}
    for msg in msgs:
        if msg.error() is None:
            lane = expected.setdefault(msg.partition() % lanes, Decoded())
            lane.consumed += 1
            _decode_one(msg, lane.batch, TOPICS, 10_000)
    got = decode_lanes(msgs, TOPICS, 10_000, lanes)
    assert sorted(got) == sorted(expected)
    for n, lane in got.items():
        assert comparable(lane) == comparable(expected[n])


def test_a_lane_of_good_samples_is_decoded_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case never takes the record-by-record path."""
    import services.sink.decode as decode_module

    def one_by_one(*args: Any) -> None:
        raise AssertionError("decoded one by one")

    monkeypatch.setattr(decode_module, "_decode_one", one_by_one)
    msgs = [raw(f"2026-11-21T11:00:{i:02d}Z") for i in range(20)]
    for i, msg in enumerate(msgs):
        msg._o, msg._p = i, i % 2
    out = decode_lanes(msgs, TOPICS, 10_000, lanes=2)
    assert [len(out[n].batch.rows) for n in (0, 1)] == [10, 10]
    assert out[1].batch.next_offsets == {("raw", 1): 20}
    assert [o[2] for o in out[0].batch.row_origins] == list(range(0, 20, 2))

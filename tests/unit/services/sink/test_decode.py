"""The sink's decode step on hand-made messages: what is stored, what is dead-lettered, and why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.sink.decode import decode_lanes
from shared.config import TopicSettings

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

    monkeypatch.setattr(decode_module, "stage_row", fragile)
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

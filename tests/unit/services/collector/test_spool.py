"""The collector's spool: records kept byte for byte, bounded, and never resent once delivered."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.collector.metrics import CollectorMetrics
from services.collector.publisher import Publisher, collector_producer
from services.collector.spool import SpooledRecord, SpoolFile, SpoolingProducer
from shared.settings.common import KafkaSettings

RECORDS = st.builds(
    SpooledRecord,
    topic=st.text(min_size=1, max_size=40),
    key=st.none() | st.binary(max_size=64),
    value=st.none() | st.binary(max_size=2048),
    headers=st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=64)), max_size=4).map(
        tuple
    ),
    timestamp_ms=st.none() | st.integers(0, 2**53),
)


def record(i: int, size: int = 10) -> SpooledRecord:
    return SpooledRecord(
        topic="raw", key=f"GPU-{i}".encode(), value=b"v" * size, headers=(("n", str(i).encode()),)
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(records=st.lists(RECORDS, max_size=30))
def test_every_record_comes_back_byte_for_byte_in_order(tmp_path: Path, records: list[SpooledRecord]) -> None:
    spool = SpoolFile(tmp_path / "spool.jsonl", max_bytes=64 * 1024 * 1024)
    assert spool.save(records) == 0
    assert [r for _, r in SpoolFile(spool.path, spool.max_bytes).load()] == records


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(records=st.lists(RECORDS, min_size=1, max_size=30), bound=st.integers(4096, 20_000))
def test_the_bound_keeps_the_oldest_and_says_what_it_dropped(
    tmp_path: Path, records: list[SpooledRecord], bound: int
) -> None:
    spool = SpoolFile(tmp_path / "bounded.jsonl", max_bytes=bound)
    dropped = spool.save(records)
    assert spool.path.stat().st_size <= bound
    kept = [r for _, r in SpoolFile(spool.path, bound).load()]
    assert kept == records[: len(records) - dropped]


def test_a_full_spool_is_logged_with_the_count_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = SpoolFile(tmp_path / "s.jsonl", max_bytes=4096)
    with caplog.at_level(logging.ERROR):
        dropped = spool.save([record(i, size=1000) for i in range(10)])
    assert dropped == 8  # two records of ~1.4 kB each fit in 4 kB with the header
    assert f"{dropped} of 10 queued messages" in caplog.text


def test_a_crash_halfway_through_a_resend_resends_only_what_was_not_delivered(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    SpoolFile(path, 1 << 20).save([record(i) for i in range(10)])
    first = SpoolFile(path, 1 << 20)
    pending = first.load()
    for index, _ in pending[:6]:
        first.mark_delivered(index)
    first.sync()  # the process dies here: no remove(), no close()
    again = SpoolFile(path, 1 << 20).load()
    assert [r for _, r in again] == [record(i) for i in range(6, 10)]


def test_delivered_marks_of_an_older_spool_and_a_torn_last_line_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    old = SpoolFile(path, 1 << 20)
    old.save([record(i) for i in range(3)])
    old.load()
    old.mark_delivered(0)
    old.sync()
    SpoolFile(path, 1 << 20).save([record(i) for i in range(3, 6)])  # a new spool replaces it
    assert [r for _, r in SpoolFile(path, 1 << 20).load()] == [record(i) for i in range(3, 6)]
    fresh = SpoolFile(path, 1 << 20)
    fresh.load()
    fresh.mark_delivered(1)
    fresh.sync()
    with fresh.delivered_path.open("ab") as torn:
        torn.write(b"2")  # no newline: a crash mid-write (it could have been "21"), so not trusted
    assert [i for i, _ in SpoolFile(path, 1 << 20).load()] == [0, 2]


def test_damaged_records_are_skipped_and_an_unreadable_spool_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    SpoolFile(path, 1 << 20).save([record(i) for i in range(3)])
    lines = path.read_bytes().split(b"\n")
    lines[2] = b'{"t": 1, "k": "%%%"}'
    path.write_bytes(b"\n".join(lines))
    assert [r for _, r in SpoolFile(path, 1 << 20).load()] == [record(0), record(2)]
    path.write_bytes(b"not a spool\n")
    assert SpoolFile(path, 1 << 20).load() == []
    assert path.with_name(path.name + ".unreadable").exists()


def publisher(spool: Path) -> Publisher:
    """A publisher whose broker never answers (nothing listens on port 1)."""
    producer = SpoolingProducer(collector_producer(KafkaSettings(bootstrap_servers="127.0.0.1:1"), 1000))
    return Publisher(producer, CollectorMetrics(CollectorRegistry()), SpoolFile(spool, 1 << 20))


def test_what_the_broker_never_took_is_spooled_with_its_headers_and_spooled_again_not_twice(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spool.jsonl"
    first = publisher(path)
    for i in range(5):
        assert first.publish("raw", f"GPU-{i}", {"i": i})
    assert first.close(0.2) == 0
    spooled = [r for _, r in SpoolFile(path, 1 << 20).load()]
    assert [(r.topic, r.key, r.value) for r in spooled] == [("raw", f"GPU-{i}".encode(), b'{"i":%d}' % i)
                                                           for i in range(5)]  # fmt: skip
    # the next start: still no broker; the spooled records are queued first, then one new one
    second = publisher(path)
    assert second.resume() == 5
    assert second.publish("raw", "GPU-new", {"i": 5})
    assert second.close(0.2) == 0
    again = [r for _, r in SpoolFile(path, 1 << 20).load()]
    assert again[:5] == spooled
    assert [r.key for r in again[5:]] == [b"GPU-new"]


def test_a_spooled_record_keeps_its_headers_and_timestamp_through_the_producer(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    with_headers = SpooledRecord(
        "raw", b"k", b"v", (("dlq.source", b"\x00\xff"), ("empty", None)), 1_700_000_000_000
    )
    SpoolFile(path, 1 << 20).save([with_headers])
    resumed = publisher(path)
    assert resumed.resume() == 1
    resumed.close(0.2)
    assert [r for _, r in SpoolFile(path, 1 << 20).load()] == [with_headers]


def test_a_spool_that_cannot_be_written_is_a_logged_loss_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    stuck = publisher(blocked / "spool.jsonl")
    assert stuck.publish("raw", "GPU-0", {"i": 0})
    with caplog.at_level(logging.ERROR):
        assert stuck.close(0.1) == 1
    assert "1 undelivered messages are lost" in caplog.text

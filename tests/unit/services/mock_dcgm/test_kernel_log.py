"""The mock's kernel logs: any catalogue XID, floods and NVLink messages of both driver generations,
served as the journal is and read by the collector's journal feed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector.events import EventDetector
from services.collector.kernel_log import JournalFeed, mock_journal, parse_xid_line
from services.mock_dcgm.clock import SimClock
from services.mock_dcgm.faults import FaultError
from services.mock_dcgm.fleet import Fleet, FleetSpec
from services.mock_dcgm.kernel_log import NodeLog, _mnemonics, kernel_pci, nvlink5_message, nvlink5_rows
from services.mock_dcgm.server import MockServer
from shared.contract.models import Source
from shared.gpu.nvlink_decode import decode_nvlink5, generation_of, load_nvlink5_table
from tests.helpers.mock_fleet import T0, make_fleet
from tests.paths import REPO

TABLE = load_nvlink5_table(REPO / "config" / "nvlink5-decode.csv")


def journal(fleet: Fleet, node: int = 0, **where: str) -> list[dict[str, str]]:
    body, _ = fleet.journal(node, after_cursor=where.get("after_cursor"), since=where.get("since"))
    return [json.loads(line) for line in body.decode().splitlines()]


def test_every_catalogue_xid_is_a_line_the_collector_reads_for_the_right_gpu() -> None:
    fleet, hand = make_fleet(nodes=1, gpus=8)
    codes = sorted(_mnemonics())
    for n, code in enumerate(codes):
        fleet.inject({"kind": "xid", "node": 0, "gpu": n % 8, "after_s": n, "params": {"code": code}})
    hand.t = len(codes) + 1
    entries = journal(fleet)
    assert len(entries) == len(codes) == 172
    for n, (code, entry) in enumerate(zip(codes, entries, strict=True)):
        at = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, UTC)
        xid = parse_xid_line(entry["MESSAGE"], at)
        assert xid is not None
        assert (xid.xid, xid.pci_bus_id, xid.time.timestamp()) == (
            code,
            fleet.nodes[0].gpus[n % 8].pci_bus_id,
            T0 + n,
        )


@pytest.mark.parametrize("driver", ["550.90.07", "575.51.02"])
def test_nvlink_xids_carry_messages_that_decode_to_their_row_in_the_drivers_generation(driver: str) -> None:
    generation = generation_of(driver)
    for code in range(144, 151):
        for index, row in enumerate(nvlink5_rows(code)):
            decoded = decode_nvlink5(TABLE, code, nvlink5_message(row, driver), generation)
            assert decoded is not None, (code, index)
            assert {(r.nvidia_action, r.severity) for r in decoded.rows} == {
                (row.nvidia_action, row.severity)
            }
    v1, v2 = (nvlink5_message(nvlink5_rows(149)[0], d) for d in ("550.90.07", "575.51.02"))
    assert v1 != v2  # the sub-unit's bits moved in R575


def test_a_fleet_on_a_new_driver_writes_the_new_generation() -> None:
    fleet = Fleet(FleetSpec(nodes=1, gpus_per_node=2, driver_version="575.51.02"), SimClock(start_s=T0))
    fleet.inject({"kind": "xid", "node": 0, "gpu": 1, "after_s": 0, "params": {"code": 145, "row": 2}})
    (entry,) = journal(fleet)
    assert nvlink5_message(nvlink5_rows(145)[2], "575.51.02") in entry["MESSAGE"]


@settings(max_examples=100, deadline=None)
@given(
    lines=st.integers(1, 5000),
    over_s=st.sampled_from([0.0, 0.5, 10.0, 59.0]),
    reads=st.lists(st.floats(0, 70), min_size=1, max_size=8),
)
def test_a_flood_writes_exactly_its_lines_in_time_order_however_often_it_is_read(
    lines: int, over_s: float, reads: list[float]
) -> None:
    fleet, hand = make_fleet(nodes=1, gpus=2)
    fleet.inject({"kind": "xid", "node": 0, "gpu": 0, "after_s": 1,
                  "params": {"code": 95, "lines": lines, "over_s": over_s}})  # fmt: skip
    seen: list[dict[str, str]] = []
    for t in [*sorted(reads), 100.0]:
        hand.t = t
        after = seen[-1]["__CURSOR"] if seen else None
        got = journal(fleet, after_cursor=after) if after else journal(fleet, since=f"@{T0:.0f}")
        assert all(T0 + 1 <= int(e["__REALTIME_TIMESTAMP"]) / 1e6 <= T0 + t + 1e-3 for e in got)
        seen += got
    assert len(seen) == lines
    stamps = [int(e["__REALTIME_TIMESTAMP"]) for e in seen]
    assert stamps == sorted(stamps)
    assert stamps[-1] == round((T0 + 1 + over_s) * 1e6) or lines == 1


def test_a_reader_behind_the_ring_is_told_what_it_lost() -> None:
    fleet, _hand = make_fleet(nodes=1, gpus=1)
    fleet.kernel_logs[0] = NodeLog("gpu-node-00", keep=10)
    fleet.inject({"kind": "xid", "node": 0, "gpu": 0, "after_s": 0, "params": {"code": 95, "lines": 25}})
    body, lost = fleet.journal(0, after_cursor="s=5", since=None)
    assert (len(body.splitlines()), lost) == (10, 10)  # 6..15 were overwritten; 16..25 are there


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"code": 95, "lines": 0}, "lines must be a whole number"),
        ({"code": 95, "lines": 2.5}, "lines must be a whole number"),
        ({"code": 95, "over_s": 1e8}, "over_s must be at most"),
        ({"code": 95, "row": 1}, "NVLink XID"),
        ({"code": 149, "row": 999}, "decode rows"),
        ({"code": 149, "row": 0.5}, "whole number"),
    ],
)
def test_log_parameters_that_cannot_be_written_are_refused(params: dict[str, float], error: str) -> None:
    fleet, _ = make_fleet(nodes=1, gpus=1)
    with pytest.raises(FaultError, match=error):
        fleet.inject({"kind": "xid", "node": 0, "gpu": 0, "params": params})


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ({"after_cursor": "s=-1"}, "after-cursor"),
        ({"after_cursor": "x"}, "after-cursor"),
        ({"since": "now"}, "since"),
    ],
)
def test_unreadable_cursors_and_times_are_refused(where: dict[str, str], error: str) -> None:
    fleet, _ = make_fleet(nodes=1, gpus=1)
    with pytest.raises(FaultError, match=error):
        journal(fleet, 0, **where)


def test_the_collectors_journal_feed_reads_each_node_for_its_own_gpus() -> None:
    """Two nodes with the same PCI addresses: each XID goes to the GPU of the node whose log it is."""
    fleet = Fleet(FleetSpec(nodes=2, gpus_per_node=2, seed=5), SimClock(start_s=T0, speed=1.0))
    with MockServer(fleet, bind="127.0.0.1", base_port=0, admin_port=0, timestamps=False) as server:
        server.start()
        journal_url = server.node_url(0).replace("/metrics", "/journal")
        bad = httpx.get(f"{journal_url}?since=yesterday", timeout=5)
        assert bad.status_code == 400
        assert "since" in bad.text
        for query in ("since=@1&since=@2", "follow=1", "a=1&b=2&c=3&d=4&e=5&f=6", "after-cursor=s%3D1%00"):
            refused = httpx.get(f"{journal_url}?{query}", timeout=5)
            assert refused.status_code == 400, query
        feeds = [JournalFeed(mock_journal(server.node_url(i)), hosts=True, from_start=True) for i in range(2)]
        fleet.inject({"kind": "xid", "node": 1, "gpu": 0, "params": {"code": 79}})
        fleet.inject({"kind": "xid", "node": 0, "gpu": 1, "params": {"code": 95, "lines": 3}})
        detector = EventDetector(collector_id="c", local_hostname="collector-host")
        from services.collector.dcgm_source import DcgmSource
        from services.collector.enrich import Enricher, Placement

        enricher = Enricher(collector_id="c", local_hostname="collector-host", placement=Placement())
        for i in range(2):
            reading = DcgmSource(server.node_url(i), kind=Source.MOCK).read()
            samples = [s for s in (enricher.sample(g, reading) for g in reading.gpus) if s]
            detector.observe(reading.target, Source.MOCK, samples, reading.read_at)
        now = datetime.now(UTC)
        events = [
            e for i, feed in enumerate(feeds) for e in detector.kernel_xids(feed.name, feed.drain(), now)
        ]
    got = sorted((e.hostname, e.gpu_uuid, e.details["xid"], e.details["origin"]) for e in events)
    assert got == [
        ("gpu-node-00", fleet.nodes[0].gpus[1].uuid, 95, "journal"),
        ("gpu-node-00", fleet.nodes[0].gpus[1].uuid, 95, "journal"),
        ("gpu-node-00", fleet.nodes[0].gpus[1].uuid, 95, "journal"),
        ("gpu-node-01", fleet.nodes[1].gpus[0].uuid, 79, "journal"),
    ]


@settings(max_examples=200, deadline=None)
@given(cursor=st.one_of(st.none(), st.text(max_size=40)), since=st.one_of(st.none(), st.text(max_size=40)))
def test_any_cursor_or_time_reads_records_or_says_why_not(cursor: str | None, since: str | None) -> None:
    log = NodeLog("gpu-node-00", keep=5)
    readable = (cursor is None or re.fullmatch(r"s=\d{1,18}", cursor)) and (
        since is None or cursor is not None or re.fullmatch(r"@\d{1,12}(\.\d{1,6})?", since)
    )
    if not readable:
        with pytest.raises(FaultError, match=r"after-cursor|since"):
            log.read(after_cursor=cursor, since=since)
        return
    records, lost = log.read(after_cursor=cursor, since=since)
    assert records == []
    assert lost >= 0


def test_a_45_soon_after_another_xid_names_it_as_the_driver_does() -> None:
    fleet, hand = make_fleet(nodes=1, gpus=8)
    fleet.inject({"kind": "dbe", "node": 0, "gpu": 3, "after_s": 10})
    fleet.inject({"kind": "job_crash", "node": 0, "gpu": 0, "after_s": 30, "params": {"gpus": 8, "code": 45}})
    hand.t = 60
    body, _ = fleet.journal(0, after_cursor=None, since=f"@{T0:.0f}")
    lines = [json.loads(entry)["MESSAGE"] for entry in body.splitlines()]
    dbe_pci = kernel_pci(fleet.nodes[0].gpus[3].pci_bus_id)
    named = [m for m in lines if ": 45, " in m and "caused by previous Xid 48" in m]
    assert [m.split("PCI:")[1][:10] for m in named] == [dbe_pci]  # only the DBE GPU's 45 names a cause
    parsed = parse_xid_line(named[0], datetime.now(UTC))
    assert parsed is not None
    assert parsed.message.endswith("caused by previous Xid 48")
    assert sum(": 45, " in m for m in lines) == 8

"""The kernel-log XID feed: NVRM lines as /dev/kmsg and the journal give them (data/kernel_xid.kmsg).

The recording holds the formats the driver writes (with and without the "PCI:" prefix, MIG
instance suffixes, repeats, lines that are not XIDs), as kmsg records with continuation lines.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from gpuhealth.gpu.readings import SourceError
from services.collector.kernel_log import (
    JournalFeed,
    KmsgFeed,
    normalize_pci,
    parse_kmsg_record,
    parse_xid_line,
)
from shared.contract.event_details import XidDetails
from tests.paths import DATA

DATA = DATA
AT = datetime(2026, 11, 22, 17, 0, tzinfo=UTC)


def records() -> list[bytes]:
    """The recording as kmsg hands it out: one record (with its continuation lines) per read."""
    out: list[str] = []
    for line in (DATA / "kernel_xid.kmsg").read_text().splitlines():
        if line.startswith(" ") and out:
            out[-1] += line + "\n"
        else:
            out.append(line + "\n")
    return [r.encode() for r in out]


def test_the_recorded_lines_give_every_xid_with_its_gpu() -> None:
    found = [x for x in (parse_kmsg_record(r, boot_wall_s=1_790_000_000.0) for r in records()) if x]
    assert [(x.pci_bus_id, x.xid) for x in found] == [
        ("00000000:3B:00.0", 79),
        ("00000000:3B:00.0", 79),  # the repeat is its own XID
        ("00000000:86:00.0", 48),
        ("00000000:86:00.0", 94),
        ("00000000:C1:00.0", 31),
        ("00000000:07:00.0", 13),  # older drivers: no "PCI:" prefix
        ("00000000:CA:00.0", 119),
        ("00000000:CA:00.0", 154),
    ]
    mig = found[4]
    assert (mig.gpu_instance, mig.compute_instance) == (2, 1)
    assert found[0].message.startswith("pid='<unknown>'")
    assert found[0].time == datetime.fromtimestamp(1_790_000_000 + 8123.456789, UTC)


@pytest.fixture
def kmsg_pair() -> Iterator[tuple[socket.socket, KmsgFeed]]:
    """A record-per-read descriptor like /dev/kmsg: a SOCK_SEQPACKET pair."""
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    feed = KmsgFeed(fd=os.dup(reader.fileno()))
    reader.close()
    yield writer, feed
    writer.close()
    feed.close()


def test_kmsg_feed_reads_what_arrived_since_the_last_poll(kmsg_pair: tuple[socket.socket, KmsgFeed]) -> None:
    writer, feed = kmsg_pair
    assert feed.drain() == []
    for record in records()[:5]:
        writer.send(record)
    assert [x.xid for x in feed.drain()] == [79, 79, 48, 94]
    assert feed.drain() == []
    writer.send(records()[-1])
    assert [x.xid for x in feed.drain()] == [154]


def test_a_kernel_log_that_cannot_be_opened_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read the kernel log"):
        KmsgFeed(str(tmp_path / "no-kmsg"))


def test_journal_feed_follows_its_cursor() -> None:
    calls: list[list[str]] = []
    pages = [
        "",  # at start: nothing since the collector started
        "\n".join(
            json.dumps(e)
            for e in (
                {
                    "__CURSOR": "c1",
                    "__REALTIME_TIMESTAMP": "1795370000000000",
                    "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                },
                {"__CURSOR": "c2", "__REALTIME_TIMESTAMP": "1795370000100000", "MESSAGE": "unrelated"},
                {
                    "__CURSOR": "c3",
                    "__REALTIME_TIMESTAMP": "bogus",
                    "MESSAGE": list(b"NVRM: Xid (PCI:0000:3b:00): 48, \xff bad utf-8"),
                },
            )
        )
        + "\nnot json\n[1, 2]\n",
        "",
    ]

    def run(args: list[str]) -> str:
        calls.append(args)
        return pages.pop(0)

    feed = JournalFeed(run)
    found = feed.drain()
    assert [(x.xid, x.pci_bus_id) for x in found] == [(79, "00000000:3B:00.0"), (48, "00000000:3B:00.0")]
    assert found[0].time == datetime.fromtimestamp(1_795_370_000, UTC)
    assert feed.drain() == []
    assert calls[0][-1].startswith("--since=@")
    assert calls[-1][-1] == "--after-cursor=c3"
    assert all(c[:2] == ["-k", "-o"] for c in calls)


@pytest.mark.parametrize(
    ("text", "bus"),
    [("0000:3b:00", "00000000:3B:00.0"), ("00000000:3B:00.0", "00000000:3B:00.0"),
     ("3b:00.1", "00000000:3B:00.1"), ("1:2:3", "00000001:02:03.0"), ("zz:00", None), ("", None)],
)  # fmt: skip
def test_pci_addresses_in_any_of_the_kernels_forms(text: str, bus: str | None) -> None:
    assert normalize_pci(text) == bus


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_line_is_an_xid_or_nothing(line: str) -> None:
    xid = parse_xid_line(line, AT)
    assert xid is None or (0 < xid.xid <= 100_000 and normalize_pci(xid.pci_bus_id) == xid.pci_bus_id)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(1, 100_000), message=st.text(max_size=700), gi=st.booleans())
def test_whatever_the_kernel_wrote_the_xid_passes_the_contract(code: int, message: str, gi: bool) -> None:
    instance = " GPU-I:3 GPU-CI:1" if gi else ""
    xid = parse_xid_line(f"NVRM: Xid (PCI:0000:3b:00{instance}): {code}, {message}", AT)
    assert xid is not None
    details = {
        "xid": xid.xid, "origin": "kmsg", "pci_bus_id": xid.pci_bus_id, "kernel_message": xid.message,
        "gpu_instance": xid.gpu_instance, "compute_instance": xid.compute_instance,
    }  # fmt: skip
    assert TypeAdapter(XidDetails).validate_python(details) == details


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_kmsg_record_is_an_xid_or_nothing(record: bytes) -> None:
    xid = parse_kmsg_record(record, boot_wall_s=1_790_000_000.0)
    assert xid is None or xid.time <= datetime.now(UTC)


@settings(max_examples=300, deadline=None)
@given(
    domain=st.integers(0, 0xFFFF), bus=st.integers(0, 255), dev=st.integers(0, 31),
    code=st.integers(1, 100_000), prefix=st.booleans(),
    message=st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=120),
)  # fmt: skip
def test_generated_xid_lines_parse_back(
    domain: int, bus: int, dev: int, code: int, prefix: bool, message: str
) -> None:
    pci = f"{'PCI:' if prefix else ''}{domain:04x}:{bus:02x}:{dev:02x}"
    xid = parse_xid_line(f"[  812.5] NVRM: Xid ({pci}): {code}, {message}", AT)
    assert xid is not None
    assert (xid.pci_bus_id, xid.xid, xid.time) == (f"{domain:08X}:{bus:02X}:{dev:02X}.0", code, AT)
    assert xid.message == message.strip()[:500]


PREFIXES = [
    "", "kernel: ", "Dec  2 11:38:47 worker4 kernel: ", "[  219.470994] ", "[Sun Feb 23 16:24:18 2025] ",
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] ", "> ",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from(PREFIXES), domain=st.integers(0, 0xFFFF), bus=st.integers(0, 255),
    dev=st.integers(0, 31), code=st.integers(1, 100_000), gap=st.sampled_from(["", " ", "  "]),
    tail=st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=80),
    cut=st.integers(0, 80),
)  # fmt: skip
def test_prefixes_odd_spacing_and_truncation_keep_the_code_and_gpu(
    prefix: str, domain: int, bus: int, dev: int, code: int, gap: str, tail: str, cut: int
) -> None:
    head = f"{prefix}NVRM: Xid (PCI:{domain:04x}:{bus:02x}:{dev:02x}):{gap} {code}"
    line = f"{head}, pid=1, name=x, {tail}"
    end = len(head)
    xid = parse_xid_line(line[: max(end, len(line) - cut)], AT)  # cut anywhere after the code
    assert xid is not None
    assert (xid.xid, xid.pci_bus_id, xid.inferred) == (code, f"{domain:08X}:{bus:02X}:{dev:02X}.0", False)


FALLEN = [
    "NVRM: GPU {pci}.0: GPU has fallen off the bus.",
    "NVRM: GPU at PCI:{pci}: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU {pci}.0\n               NVRM: (PCI ID: 10de:2330) installed in this system has\n"
    "               NVRM: fallen off the bus and is not responding to commands.",
]


@settings(max_examples=200, deadline=None)
@given(
    form=st.sampled_from(FALLEN), prefix=st.sampled_from(PREFIXES), domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 255), dev=st.integers(0, 31),
)  # fmt: skip
def test_the_fell_off_the_bus_line_without_an_xid_is_79_for_its_gpu(
    form: str, prefix: str, domain: int, bus: int, dev: int
) -> None:
    text = prefix + form.format(pci=f"{domain:04x}:{bus:02x}:{dev:02x}")
    xid = parse_xid_line(text, AT)
    assert xid is not None
    assert (xid.xid, xid.pci_bus_id, xid.inferred) == (79, f"{domain:08X}:{bus:02X}:{dev:02X}.0", True)
    assert "\n" not in xid.message
    assert "fallen off the bus" in xid.message
    # as /dev/kmsg hands out the same record: its own newlines escaped, KEY=value lines after it
    escaped = form.format(pci=f"{domain:04x}:{bus:02x}:{dev:02x}").replace("\n", "\\x0a")
    record = f"3,1207,9100000000,-;{escaped}\n SUBSYSTEM=pci\n".encode()
    from_kmsg = parse_kmsg_record(record, boot_wall_s=1_790_000_000.0)
    assert from_kmsg is not None
    assert (from_kmsg.xid, from_kmsg.pci_bus_id, from_kmsg.inferred) == (79, xid.pci_bus_id, True)


def test_fell_off_the_bus_text_that_names_no_gpu_is_nothing() -> None:
    assert parse_xid_line("kernel: NVRM: GPU has fallen off the bus.", AT) is None
    assert (
        parse_xid_line("NVRM: The NVIDIA GPU invalid-bdf.0\nNVRM: fallen off the bus and is not", AT) is None
    )
    # an XID line wins over the bus text in the same record
    both = parse_xid_line("NVRM: Xid (PCI:0000:b3:00): 79, pid=1, GPU has fallen off the bus.", AT)
    assert both is not None
    assert not both.inferred

"""The nodes' kernel logs: the NVRM XID lines the driver writes for each fault, read as the journal is.

Every fault that logs an XID (services.mock_dcgm.faults.xid_of) writes its lines
to its node's kernel log as simulated time reaches them, in the driver's form:

    NVRM: Xid (PCI:0000:18:00): 95, pid=2231, name=python3, <message>

An `xid` fault takes, beside its `code`:

- `lines` (default 1) and `over_s` (default 0): a flood, `lines` lines of the
  code spread evenly over `over_s` seconds from the fault's start;
- `row` (default 0, NVLink XIDs 144-150 only): which row of NVIDIA's decode table
  (config/nvlink5-decode.csv, in its order, counting that code's rows) the message
  reports; it is written in the form of the fleet's driver: intrInfo by the V1
  mask before R575, by the V2 mask from R575 (shared.gpu.nvlink_decode).

Other codes carry the catalogue's mnemonic (config/xid-catalog.csv) as their
message; 74 carries the seven NVLink registers NVIDIA's workflow reads (a
mechanical bit set). A 45 (a job's channels torn down) within `CAUSE_S` of
another XID on its GPU names it, as the driver does: `... caused by previous Xid 48`.
Each node's log is a ring of `MAX_RECORDS` records, as the kernel's is: a reader
that falls behind it is told how many it lost.

A node serves its log at ``GET /journal`` as ``journalctl -k -o json`` prints it
(one JSON entry a line: ``__CURSOR``, ``__REALTIME_TIMESTAMP`` in microseconds,
``_HOSTNAME``, ``MESSAGE``), from ``?after-cursor=<cursor>`` or
``?since=@<epoch seconds>`` (simulated time); the collector reads it with its
journal feed (GPUHEALTH_COLLECTOR__KERNEL_LOG=mock).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.gpu.nvlink_decode import Nvlink5Row, generation_of, parse_nvlink5_table
from shared.gpu.xid_catalog import parse_catalog

from .faults import Fault, FaultError, FaultKind, xid_of

if TYPE_CHECKING:
    from .simulation import GpuSim

CONFIG = Path(__file__).resolve().parents[2] / "config"
NVLINK5_CODES = range(144, 151)
MAX_RECORDS = 1_000_000  # records a node's ring keeps
MAX_REPLY = 50_000  # records one read returns; the next read goes on from its cursor
MAX_LINES = 10_000_000  # lines one fault may log
CAUSE_S = 30.0  # a 45 this soon after another XID on its GPU names that XID as its cause
PREEMPTIVE_REMOVAL = 45
_CURSOR = re.compile(r"^s=(\d{1,18})$")
_SINCE = re.compile(r"^@(\d{1,12}(?:\.\d{1,6})?)$")


@functools.cache
def _nvlink5_rows() -> tuple[Nvlink5Row, ...]:
    return parse_nvlink5_table((CONFIG / "nvlink5-decode.csv").read_text(encoding="utf-8"))


@functools.cache
def _mnemonics() -> dict[int, str]:
    catalogue = parse_catalog((CONFIG / "xid-catalog.csv").read_text(encoding="utf-8"))
    return {code: entry.mnemonic for code, entry in catalogue.items()}


def nvlink5_rows(code: int) -> list[Nvlink5Row]:
    """NVIDIA's decode rows of one NVLink XID, in the table's order."""
    return [r for r in _nvlink5_rows() if r.xid == code]


def check_xid_params(params: dict[str, float]) -> None:
    """FaultError for an `xid` fault's log parameters that cannot be written."""
    code, lines, row = int(params["code"]), params["lines"], params["row"]
    if lines != int(lines) or not 1 <= lines <= MAX_LINES:
        raise FaultError(f"xid lines must be a whole number from 1 to {MAX_LINES:,}")
    if params["over_s"] > 30 * 86400:
        raise FaultError("xid over_s must be at most 30 days")
    if row != int(row):
        raise FaultError("xid row must be a whole number")
    if code in NVLINK5_CODES:
        if row >= len(nvlink5_rows(code)):
            raise FaultError(f"XID {code} has {len(nvlink5_rows(code))} decode rows: row must be below that")
    elif row:
        raise FaultError("xid row names a decode row of an NVLink XID (144-150) only")


def kernel_pci(pci_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as the driver's XID line writes it: "0000:18:00"."""
    domain, bus, rest = pci_bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


def nvlink5_message(row: Nvlink5Row, driver_version: str, link: int = 4) -> str:
    """The kernel message a driver of `driver_version` writes for an error of this decode row."""
    generation = generation_of(driver_version) or "v1"
    intr = row.masks[generation].value  # the bits the row leaves open are 0
    status = min(row.error_status) if row.error_status else 0
    fatal = "Nonfatal" if row.severity.lower().startswith("non") else "Fatal"
    v1, _, v2 = row.subcode.partition("/")  # the table's "V1/V2" where the generations name it differently
    unit = (v2 or v1) if generation == "v2" else v1
    return (
        f"{unit} {fatal} XC0 i0 Link {link:02d} (0x{intr:08x} 0x{status:08x} 0x00000000 0x00000000"
        " 0x00000000 0x00000000 0x00000000 0x00000000)"
    )


def xid_message(fault: Fault, code: int, driver_version: str) -> str:
    if code in NVLINK5_CODES and fault.kind is FaultKind.XID:
        return nvlink5_message(nvlink5_rows(code)[int(fault.params.get("row", 0))], driver_version)
    if code == 74:
        return "NVLink: fatal error detected on link 2(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    return _mnemonics().get(code, "Unknown error").replace("_", " ").lower()


def _cause(gpu: GpuSim, fault: Fault, code: int) -> str:
    """The driver's note on a 45 that another XID of its GPU caused, else nothing."""
    if code != PREEMPTIVE_REMOVAL:
        return ""
    before = [
        f
        for f in gpu.faults
        if f is not fault and xid_of(f) not in (None, code) and 0 <= fault.start_s - f.start_s <= CAUSE_S
    ]
    return f" caused by previous Xid {xid_of(max(before, key=lambda f: f.start_s))}" if before else ""


def _lines(fault: Fault) -> tuple[int, float]:
    if fault.kind is not FaultKind.XID:
        return 1, 0.0
    return int(fault.params.get("lines", 1)), float(fault.params.get("over_s", 0.0))


def lines_due(fault: Fault, t: float) -> int:
    """How many of the fault's lines the driver has written by simulated time t (none from its end on:
    a fault cleared, or a GPU repaired, logs no more)."""
    lines, over = _lines(fault)
    end = fault.end_s
    if end is not None and end <= t:
        t = end - 1e-6
    if t < fault.start_s:
        return 0
    if over <= 0 or lines == 1:
        return lines
    return min(lines, math.floor((t - fault.start_s) / over * (lines - 1) + 1e-9) + 1)


def line_time(fault: Fault, k: int) -> float:
    lines, over = _lines(fault)
    return fault.start_s if lines == 1 else fault.start_s + over * k / (lines - 1)


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    time_s: float
    message: str


class NodeLog:
    """One node's kernel log: its GPUs' XID lines in time order, as simulated time passes them."""

    def __init__(self, hostname: str, *, keep: int = MAX_RECORDS) -> None:
        self.hostname = hostname
        self.records: deque[Record] = deque(maxlen=keep)
        self._seq = 0
        self._written: dict[int, int] = {}  # fault id -> lines written

    def catch_up(self, gpus: list[GpuSim], t: float, driver_version: str) -> None:
        """Write every line due by t (call under the node's lock)."""
        new: list[tuple[float, int, str]] = []
        for gpu in gpus:
            for fault in gpu.faults:
                code = xid_of(fault)
                if code is None:
                    continue
                done, due = self._written.get(fault.id, 0), lines_due(fault, t)
                if due <= done:
                    continue
                said = xid_message(fault, code, driver_version) + _cause(gpu, fault, code)
                text = (
                    f"NVRM: Xid (PCI:{kernel_pci(gpu.pci_bus_id)}): {code}, pid={2000 + gpu.index * 17},"
                    f" name=python3, {said}"
                )
                new += [(line_time(fault, k), fault.id, text) for k in range(done, due)]
                self._written[fault.id] = due
        for time_s, _, text in sorted(new, key=lambda line: (line[0], line[1])):
            self._seq += 1
            self.records.append(Record(self._seq, time_s, text))

    def read(self, *, after_cursor: str | None = None, since: str | None = None) -> tuple[list[Record], int]:
        """The records after a cursor, or from a time (FaultError for either unreadable); and how many
        the cursor's reader lost to the ring."""
        oldest = self.records[0].seq if self.records else self._seq + 1
        if after_cursor is not None:
            match = _CURSOR.match(after_cursor)
            if match is None:
                raise FaultError("after-cursor must be a cursor this log gave (s=<number>)")
            after = int(match[1])
            lost = max(0, oldest - after - 1)
            start = max(0, after + 1 - oldest)
            return list(itertools.islice(self.records, start, start + MAX_REPLY)), lost
        if since is not None:
            match = _SINCE.match(since)
            if match is None:
                raise FaultError("since must be @<epoch seconds>")
            from_s = float(match[1])
            return [r for r in self.records if r.time_s >= from_s][:MAX_REPLY], 0
        return list(self.records)[-MAX_REPLY:], 0

    def journal(self, records: list[Record]) -> bytes:
        """Records as `journalctl -k -o json` prints them."""
        return b"".join(
            json.dumps(entry(r, self.hostname), separators=(",", ":")).encode() + b"\n" for r in records
        )


def entry(record: Record, hostname: str) -> dict[str, Any]:
    return {
        "__CURSOR": f"s={record.seq}",
        "__REALTIME_TIMESTAMP": str(round(record.time_s * 1e6)),
        "_HOSTNAME": hostname,
        "_TRANSPORT": "kernel",
        "PRIORITY": "4",
        "MESSAGE": record.message,
    }

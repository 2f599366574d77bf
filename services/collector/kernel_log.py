"""XIDs from the kernel log: the NVIDIA driver's `NVRM: Xid (PCI:...): NN, ...` lines.

DCGM and NVML do not report every XID (79, 119 and 120 among them can come
too late or not at all), while the driver writes each one to the kernel log.
This feed reads that log beside whichever source reports the GPUs:

- `/dev/kmsg` (needs CAP_SYSLOG where ``kernel.dmesg_restrict=1``): opened
  non-blocking at its end, so only lines written after the collector started
  count, and each poll reads what arrived since;
- the systemd journal (``journalctl -k -o json``), from a cursor, where
  /dev/kmsg cannot be read.

A line names the GPU by PCI address (domain:bus:device, no function); the
collector maps it to the GPU whose sample has that bus id. Lines this
module does not recognise are ignored; nothing in a line can raise.

What the driver really writes, and how each is read:

- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <message>``, also without
  ``PCI:``, with a function (``.0``), with MIG's ``GPU-I:02 GPU-CI:01``, with odd
  spacing, after any prefix (``kernel:``, a syslog or ``dmesg -T`` time, ``[ 123.456]``)
  and cut short anywhere after the code;
- the loss of a GPU as a line of its own, with no XID in it: ``NVRM: GPU
  0000:3b:00.0: GPU has fallen off the bus.``, ``NVRM: GPU at PCI:0000:3b:00: GPU has
  fallen off the bus.``, and the three-line ``NVRM: The NVIDIA GPU 0000:b3:00.0 /
  (PCI ID: 10de:26b5) installed in this system has / fallen off the bus and is not
  responding to commands.`` (one kmsg record, its newlines escaped as ``\\x0a``).
  Each is read as XID 79 for the GPU it names, marked ``inferred`` (the detector
  counts it once with the XID 79 line the driver may also write); a line that names
  no GPU is not an XID of any GPU and is ignored.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, Protocol

import httpx

from gpuhealth.gpu.readings import SourceError

log = logging.getLogger(__name__)

MAX_XID_CODE = 100_000  # the contract's bound on an XID code
MAX_MESSAGE_CHARS = 500

_ADDRESS = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?"
_XID_LINE = re.compile(
    rf"NVRM:\s*Xid\s*\(\s*(?:PCI:)?(?P<pci>{_ADDRESS})"
    r"(?P<extra>[^)]{0,64})\)\s*:?\s*(?P<code>\d{1,9})\b,?\s?(?P<message>.*)"
)
# The driver's own line for a GPU lost from the bus, with no XID in it (see the module docstring).
_FALLEN = (
    re.compile(rf"NVRM:\s*GPU\s+(?:at\s+)?(?:PCI:)?(?P<pci>{_ADDRESS})\s*:\s*GPU has fallen off the bus"),
    re.compile(
        rf"NVRM:\s*The NVIDIA GPU\s+(?:PCI:)?(?P<pci>{_ADDRESS})[\s\S]{{0,200}}?fallen off the bus",
    ),
)
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
# Control characters and lone surrogates: the contract refuses them (PostgreSQL cannot store NUL).
_UNSTORABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_INSTANCE = re.compile(r"GPU-I:(?P<gi>\d{1,3})(?:\s+GPU-CI:(?P<ci>\d{1,3}))?")
_PCI = re.compile(
    r"^(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):(?P<dev>[0-9A-Fa-f]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


@dataclass(frozen=True, slots=True)
class KernelXid:
    """One XID line: when the kernel logged it, the GPU's PCI bus id (NVML's form), the code."""

    time: datetime
    pci_bus_id: str
    xid: int
    message: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    hostname: str | None = None  # the host whose log it is, where the feed reads several (the mock fleet's)
    inferred: bool = False  # the line names no XID: a GPU that fell off the bus, read as XID 79


class XidFeed(Protocol):
    """Somewhere XIDs come from apart from the GPU sources; `drain` returns what is new."""

    name: str

    def drain(self) -> list[KernelXid]: ...

    def close(self) -> None: ...


def normalize_pci(text: str) -> str | None:
    """A PCI address as NVML writes it ("00000000:3B:00.0"), from any of the kernel's forms."""
    match = _PCI.match(text.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    return f"{domain:08X}:{int(match['bus'], 16):02X}:{int(match['dev'], 16):02X}.{match['fn'] or '0'}"


FELL_OFF_THE_BUS = 79


def parse_xid_line(line: str, at: datetime) -> KernelXid | None:
    """The XID in one kernel log message (a record, which may hold several lines), or None when it
    is neither an NVRM XID report nor the driver's line for a GPU that fell off the bus."""
    match = _XID_LINE.search(line)
    if match is None:
        return _fallen_off(line, at)
    code = int(match["code"])
    pci = normalize_pci(match["pci"])
    if pci is None or not 0 < code <= MAX_XID_CODE:
        return None
    instance = _INSTANCE.search(match["extra"])
    return KernelXid(
        time=at,
        pci_bus_id=pci,
        xid=code,
        message=_UNSTORABLE.sub("?", match["message"]).strip()[:MAX_MESSAGE_CHARS],
        gpu_instance=int(instance["gi"]) if instance else None,
        compute_instance=int(instance["ci"]) if instance and instance["ci"] else None,
    )


def parse_kmsg_record(record: bytes, boot_wall_s: float) -> KernelXid | None:
    """One /dev/kmsg record ("prio,seq,usec,flags;text\\n KEY=value..."): its XID, if any."""
    text = record.decode("utf-8", "replace")
    header, sep, body = text.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    try:
        usec = int(fields[2]) if len(fields) > 2 else 0
    except ValueError:
        usec = 0
    when = boot_wall_s + usec / 1e6
    at = datetime.fromtimestamp(min(max(when, 0.0), time.time()), UTC)
    # The text ends at the first real newline (KEY=value lines follow); its own newlines are escaped.
    return parse_xid_line(unescape_kmsg(body.split("\n", 1)[0]), at)


def unescape_kmsg(text: str) -> str:
    """A kmsg record's text as the driver wrote it: /dev/kmsg writes control bytes (a message's own
    newlines among them) as ``\\xNN``."""
    return _KMSG_ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)


def _fallen_off(text: str, at: datetime) -> KernelXid | None:
    """XID 79 for the GPU a fell-off-the-bus line without an XID names; None for any other text."""
    if "fallen off the bus" not in text[:2000]:
        return None
    for pattern in _FALLEN:
        found = pattern.search(text[:2000])
        if found is not None and (pci := normalize_pci(found["pci"])) is not None:
            said = " ".join(part.removeprefix("NVRM:").strip() for part in found[0].splitlines())
            return KernelXid(
                time=at,
                pci_bus_id=pci,
                xid=FELL_OFF_THE_BUS,
                message=_UNSTORABLE.sub("?", said).strip()[:MAX_MESSAGE_CHARS],
                inferred=True,
            )
    return None


class KmsgFeed:
    """Reads /dev/kmsg from where it ended when opened."""

    name = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", *, fd: int | None = None) -> None:
        """Opens `path` at its end; `fd`: an already open, non-blocking, record-per-read descriptor."""
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                os.lseek(fd, 0, os.SEEK_END)
            except OSError as e:
                raise SourceError(f"cannot read the kernel log at {path}: {e}") from e
        self._fd = fd
        self.lost_records = 0

    def drain(self) -> list[KernelXid]:
        # kmsg stamps records on the monotonic clock since boot
        boot_wall_s = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
        found: list[KernelXid] = []
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                return found
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring buffer overwrote records we had not read
                    self.lost_records += 1
                    continue
                raise SourceError(f"reading /dev/kmsg failed: {e}") from e
            if not record:
                return found
            xid = parse_kmsg_record(record, boot_wall_s)
            if xid is not None:
                found.append(xid)

    def close(self) -> None:
        os.close(self._fd)


Runner = Callable[[list[str]], str]


def run_journalctl(args: list[str]) -> str:
    try:
        done = subprocess.run(["journalctl", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"journalctl could not run: {e}") from e
    if done.returncode != 0:
        raise SourceError(f"journalctl failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return done.stdout


def _journal_message(entry: dict[str, object]) -> str:
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald sends non-UTF-8 text as a list of bytes
        return bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
    return message if isinstance(message, str) else ""


class JournalFeed:
    """Reads kernel messages from the systemd journal, each poll after the last cursor seen.

    With `hosts`, each XID names the host its entry does (`_HOSTNAME`): a journal of another host
    (a mock fleet node's, `mock_journal`) is matched to that host's GPUs. A journal whose clock
    is not this host's (the mock's simulated one) is read from its start, not from now
    (`from_start`): what it held when the feed opened is passed over all the same.
    """

    name = "journal"

    def __init__(
        self, runner: Runner = run_journalctl, *, hosts: bool = False, from_start: bool = False
    ) -> None:
        self.run = runner
        self.hosts = hosts
        self.cursor: str | None = None
        self._since = None if from_start else f"@{int(time.time())}"  # systemd's form of a UNIX time
        self.drain()  # fails now, not at the first poll, where the journal cannot be read

    def drain(self) -> list[KernelXid]:
        where = (
            [f"--after-cursor={self.cursor}"]
            if self.cursor
            else [f"--since={self._since}"]
            if self._since
            else []
        )
        output = self.run(["-k", "-o", "json", "--no-pager", *where])
        found: list[KernelXid] = []
        for line in output.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            cursor = entry.get("__CURSOR")
            if isinstance(cursor, str):
                self.cursor = cursor
            try:
                at = datetime.fromtimestamp(int(str(entry.get("__REALTIME_TIMESTAMP"))) / 1e6, UTC)
            except (ValueError, OverflowError, OSError):
                at = datetime.now(UTC)
            xid = parse_xid_line(_journal_message(entry), at)
            host = entry.get("_HOSTNAME") if self.hosts else None
            if xid is not None:
                found.append(replace(xid, hostname=host) if isinstance(host, str) and host else xid)
        return found

    def close(self) -> None:
        return None


def mock_journal(metrics_url: str, *, timeout_s: float = 5.0) -> Runner:
    """`journalctl -k -o json` of a mock fleet node: its `/journal` beside its `/metrics`
    (services/mock_dcgm/kernel_log.py), asked from the cursor or time journalctl would be."""
    url = metrics_url.rsplit("/metrics", 1)[0] + "/journal"

    def run(args: list[str]) -> str:
        query = dict(
            a.removeprefix("--").split("=", 1) for a in args if a.startswith(("--after-cursor=", "--since="))
        )
        try:
            reply = httpx.get(url, params=query, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise SourceError(f"the mock journal at {url} did not answer: {e}") from e
        if reply.status_code != 200:
            raise SourceError(f"the mock journal at {url} refused: {reply.status_code} {reply.text[:200]}")
        lost = reply.headers.get("X-Journal-Lost", "0")
        if lost != "0":
            log.warning("kernel log records lost before they were read", extra={"url": url, "lost": lost})
        return reply.text

    return run


def open_kernel_log(kind: Literal["kmsg", "journal", "auto"]) -> XidFeed:
    """The kernel-log feed asked for; `auto` is /dev/kmsg, else the journal. SourceError if neither."""
    if kind in ("kmsg", "auto"):
        try:
            return KmsgFeed()
        except SourceError as e:
            if kind == "kmsg":
                raise
            log.info("kernel log: %s; trying the journal", e)
    return JournalFeed()

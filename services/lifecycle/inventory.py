"""The operator's inventory of what the money depends on: one CSV row per GPU, by serial (else UUID).

    serial,gpu_uuid,purchase_date,purchase_price,warranty_end,rma_turnaround_days,spares_on_hand,note
    1652922012345,,2024-03-01,30000,2027-03-01,21,2,rack a1 cohort

A row names its GPU by `serial` (what the vendor's RMA form asks for), by
`gpu_uuid` where the serial is not known, or by both. Every other cell may be
empty: an empty cell is an input the decision lists as missing, never a zero.
Lines starting with `#` are comments. Each bad row is refused with its line
and every reason, and every good row still loads: a negative price, a purchase
in the future, a warranty that ends before the purchase or more than
:data:`MAX_WARRANTY_YEARS` after it, a GPU named on two rows (both are refused:
which one is right cannot be told), bytes that are not UTF-8. What spoils the
whole file (an unknown or repeated column, no column naming the GPU, a file
too large) is an :class:`InventoryError`.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

from shared.contract.models import GPU_UUID_PATTERN
from shared.plumbing.errors import GpuHealthError
from shared.store.lifecycle import INVENTORY_COLUMNS

COLUMNS = INVENTORY_COLUMNS[1:-1]  # the file's columns: the table's, less the line and the load's time
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ROWS = 1_000_000
MAX_CELL = 500  # characters: a note, a serial
MAX_PRICE = 10_000_000.0
MAX_TURNAROUND_DAYS = 365
MAX_SPARES = 100_000
MAX_WARRANTY_YEARS = 10
# No GPU in a fleet today was bought before this: an earlier date is a typo (a year 0024, a 1970 default).
EARLIEST_PURCHASE = date(2000, 1, 1)
SERIAL_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_UUID = re.compile(GPU_UUID_PATTERN)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]")  # U+FFFD: what a byte that is not UTF-8 decoded to


class InventoryError(GpuHealthError):
    """The inventory file cannot be read as an inventory at all (its rows' problems are not this)."""


@dataclass(frozen=True, slots=True)
class InventoryEntry:
    """One GPU's row, validated; None is a cell left empty."""

    line: int
    serial: str | None
    gpu_uuid: str | None
    purchase_date: date | None = None
    purchase_price: float | None = None
    warranty_end: date | None = None
    rma_turnaround_days: int | None = None
    spares_on_hand: int | None = None
    note: str | None = None

    @property
    def key(self) -> str:
        """How the row names its GPU: its serial where it has one."""
        return f"serial {self.serial}" if self.serial else f"gpu_uuid {self.gpu_uuid}"


@dataclass(frozen=True, slots=True)
class RowProblem:
    """A row refused: its line, the GPU it names (where it names one) and every reason."""

    line: int
    gpu: str | None
    problem: str


@dataclass(frozen=True, slots=True)
class Inventory:
    entries: tuple[InventoryEntry, ...] = ()
    problems: tuple[RowProblem, ...] = ()
    _by_serial: dict[str, InventoryEntry] = field(default_factory=dict, repr=False, compare=False)
    _by_uuid: dict[str, InventoryEntry] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for e in self.entries:
            if e.serial:
                self._by_serial[e.serial] = e
            if e.gpu_uuid:
                self._by_uuid[e.gpu_uuid] = e

    def lookup(self, *, serial: str | None, gpu_uuid: str) -> InventoryEntry | None:
        """The GPU's row: by its serial first, by its UUID where no row has the serial."""
        return (self._by_serial.get(serial) if serial else None) or self._by_uuid.get(gpu_uuid)


def load_inventory(path: Path, *, today: date) -> Inventory:
    """Read and validate the inventory file (InventoryError: it cannot be read as one)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InventoryError(f"inventory {path}: {size} bytes, more than {MAX_FILE_BYTES}")
        raw = path.read_bytes()
    except OSError as e:
        raise InventoryError(f"inventory {path}: {e.strerror or e}") from e
    try:
        return parse_inventory(raw, today=today)
    except InventoryError as e:
        raise InventoryError(f"inventory {path}: {e}") from e


def parse_inventory(raw: bytes, *, today: date) -> Inventory:
    """Validate the file's bytes: good rows load, bad ones are listed (InventoryError: no header)."""
    if len(raw) > MAX_FILE_BYTES:
        raise InventoryError(f"{len(raw)} bytes, more than {MAX_FILE_BYTES}")
    # Bytes that are not UTF-8 spoil their own line only (they become U+FFFD and the row is refused).
    text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")
    header: list[str] | None = None
    entries: list[InventoryEntry] = []
    problems: list[RowProblem] = []
    # Lines as an editor numbers them (str.splitlines would also split at form feeds and U+2028).
    for number, line in enumerate((raw_line.removesuffix("\r") for raw_line in text.split("\n")), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(entries) + len(problems) >= MAX_ROWS:
            raise InventoryError(f"more than {MAX_ROWS} rows")
        try:
            cells = next(csv.reader([line.replace("\x00", "\ufffd")], strict=True))
        except csv.Error as e:
            if header is None:
                raise InventoryError(f"line {number}: the header is not CSV ({e})") from e
            problems.append(RowProblem(number, None, f"not CSV ({e}); a quoted cell may not span lines"))
            continue
        if header is None:
            header = _header(cells, number)
            continue
        if len(cells) > len(header):
            problems.append(RowProblem(number, None, f"{len(cells)} cells, the header names {len(header)}"))
            continue
        row = dict(zip(header, [c.strip() for c in cells], strict=False))
        entry, why = _entry(number, row, today)
        if entry is None:
            problems.append(RowProblem(number, _named(row), "; ".join(why)))
        else:
            entries.append(entry)
    if header is None:
        raise InventoryError(f"no header line: expected the columns {', '.join(COLUMNS)}")
    kept, doubled = _without_duplicates(entries)
    problems.extend(doubled)
    return Inventory(entries=tuple(kept), problems=tuple(sorted(problems, key=lambda p: p.line)))


def _header(cells: list[str], number: int) -> list[str]:
    names = [c.strip().lower() for c in cells]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise InventoryError(
            f"line {number}: unknown column(s) {', '.join(map(repr, unknown))}; the columns are "
            f"{', '.join(COLUMNS)}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InventoryError(f"line {number}: column(s) {', '.join(repeated)} named twice")
    if "serial" not in names and "gpu_uuid" not in names:
        raise InventoryError(f"line {number}: no `serial` or `gpu_uuid` column: no row could name its GPU")
    return names


def _named(row: dict[str, str]) -> str | None:
    """The GPU a refused row names, where its name is well formed (for the operator to find it)."""
    serial, uuid = row.get("serial", ""), row.get("gpu_uuid", "")
    if SERIAL_PATTERN.match(serial):
        return f"serial {serial}"
    return f"gpu_uuid {uuid}" if _UUID.match(uuid) else None


def _entry(number: int, row: dict[str, str], today: date) -> tuple[InventoryEntry | None, list[str]]:
    why: list[str] = []
    for column, cell in row.items():
        if _CONTROL.search(cell):
            why.append(f"{column}: a control character or bytes that are not UTF-8")
        elif len(cell) > MAX_CELL:
            why.append(f"{column}: {len(cell)} characters, at most {MAX_CELL}")
    if why:
        return None, why
    serial = row.get("serial") or None
    uuid = row.get("gpu_uuid") or None
    if serial is None and uuid is None:
        why.append("no serial and no gpu_uuid: the row names no GPU")
    if serial is not None and not SERIAL_PATTERN.match(serial):
        why.append(f"serial {serial!r}: 1-64 letters, digits, '.', '_' or '-'")
    if uuid is not None and not _UUID.match(uuid):
        why.append(f"gpu_uuid {uuid!r}: not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    bought = _date(row, "purchase_date", why)
    ends = _date(row, "warranty_end", why)
    if bought is not None and bought > today:
        why.append(f"purchase_date {bought} is in the future (today is {today})")
    if bought is not None and bought < EARLIEST_PURCHASE:
        why.append(f"purchase_date {bought} is before {EARLIEST_PURCHASE}: a typo?")
    if ends is not None and bought is not None and ends < bought:
        why.append(f"warranty_end {ends} is before purchase_date {bought}")
    since = bought or today
    if ends is not None and ends > since + timedelta(days=round(365.25 * MAX_WARRANTY_YEARS)):
        what = "purchase_date" if bought else "today"
        why.append(f"warranty_end {ends} is more than {MAX_WARRANTY_YEARS} years after {what}: a typo?")
    price = _number(row, "purchase_price", why, MAX_PRICE)
    turnaround = _count(row, "rma_turnaround_days", why, MAX_TURNAROUND_DAYS)
    spares = _count(row, "spares_on_hand", why, MAX_SPARES)
    if why:
        return None, why
    entry = InventoryEntry(
        line=number,
        serial=serial,
        gpu_uuid=uuid,
        purchase_date=bought,
        purchase_price=price,
        warranty_end=ends,
        rma_turnaround_days=turnaround,
        spares_on_hand=spares,
        note=row.get("note") or None,
    )
    return entry, []


def _date(row: dict[str, str], column: str, why: list[str]) -> date | None:
    cell = row.get(column, "")
    if not cell:
        return None
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", cell):
            raise ValueError
        return date.fromisoformat(cell)
    except ValueError:
        why.append(f"{column} {cell!r}: not a date as YYYY-MM-DD")
        return None


_PLAIN_NUMBER = r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?"


def _number(row: dict[str, str], column: str, why: list[str], most: float) -> float | None:
    cell = row.get(column, "")
    if not cell:
        return None
    if not re.fullmatch(_PLAIN_NUMBER, cell):
        why.append(f"{column} {cell!r}: a plain number such as 30000.00 (no currency sign or separators)")
        return None
    return _within(float(cell), column, cell, why, most)


def _count(row: dict[str, str], column: str, why: list[str], most: int) -> int | None:
    cell = row.get(column, "")
    if not cell:
        return None
    if not re.fullmatch(r"[+-]?\d{1,12}", cell):
        why.append(f"{column} {cell!r}: a whole number")
        return None
    found = _within(int(cell), column, cell, why, most)
    return None if found is None else int(found)


def _within(value: float, column: str, cell: str, why: list[str], most: float) -> float | None:
    """`value` where it lies in 0..most, else None and why."""
    if value < 0:
        why.append(f"{column} {cell}: negative")
    elif not math.isfinite(value) or value > most:
        why.append(f"{column} {cell}: more than {most:g}")
    else:
        return value
    return None


def _without_duplicates(entries: list[InventoryEntry]) -> tuple[list[InventoryEntry], list[RowProblem]]:
    """Every row of a GPU named twice (by serial, or by UUID) is refused, naming the other lines."""
    lines: dict[str, list[int]] = defaultdict(list)
    for e in entries:
        for name in {
            f"serial {e.serial}" if e.serial else "",
            f"gpu_uuid {e.gpu_uuid}" if e.gpu_uuid else "",
        }:
            if name:
                lines[name].append(e.line)
    kept, problems = [], []
    for e in entries:
        names = [n for n in (f"serial {e.serial}", f"gpu_uuid {e.gpu_uuid}") if len(lines.get(n, ())) > 1]
        if not names:
            kept.append(e)
            continue
        others = sorted({line for n in names for line in lines[n]} - {e.line})
        problems.append(
            RowProblem(
                e.line,
                e.key,
                f"{names[0]} is also on line(s) {', '.join(map(str, others))}: none of its rows is used "
                "until one remains",
            )
        )
    return kept, problems

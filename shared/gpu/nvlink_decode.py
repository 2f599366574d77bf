"""NVLink XIDs decoded from the kernel log's message: 144-150 by NVIDIA's table, 74 by its registers.

An NVLink5 XID (Blackwell) reads, after the code,

    <sub-unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrInfo> <errorStatus> <debug data>...)

in the shapes real drivers write: the link as `00`, `4` or `-1` (no one link: the
GPU's, as GB200's NETIR link-down events are), any number of debug words, and the
sub-unit by either generation's name where NVIDIA's table gives two (`V1/V2`):
a name only one generation writes says which generation wrote the message,
whatever the inventory's driver version says.

NVIDIA's decode table (config/nvlink5-decode.csv, this project's copy of the rows
of NVIDIA's "XID 144-150 Decode"; tests/unit/shared/test_nvlink_decode.py checks it
against the reference facts) matches `intrInfo` against a bit mask, one per driver
generation (V1 before R575, V2 from R575: the sub-unit moved from bits 9:5 to 6:0),
and `errorStatus` against a value; the matching row gives the severity and NVIDIA's
recovery action. An XID 74 (Ampere/Hopper NVLink) carries seven registers whose set
bits NVIDIA's NVLink workflow sorts into ignorable, sympathetic, ECC/parity,
mechanical (seating, signal integrity) and unexpected.

Every decoder takes any text and never raises on it: a message it cannot read
decodes to None (the caller takes the safe action and says the decode was not
possible).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shared.plumbing.errors import ConfigError

Generation = Literal["v1", "v2"]
GENERATIONS: dict[Generation, str] = {"v1": "before R575", "v2": "R575 and later"}
_MAX_TEXT = 1000  # the contract caps kernel messages at 500 characters; the decoders read no further
_HEX = r"0x[0-9A-Fa-f]{1,8}"
_NVLINK5 = re.compile(
    rf"(?P<unit>[A-Z][A-Z0-9_]{{1,40}}(?:/[A-Z][A-Z0-9_]{{1,40}})?)\s+(?P<fatal>Fatal|Non-?fatal)\b.{{0,40}}?\bLink\s+(?P<link>-?\d{{1,3}})"
    rf"\s*[(\[]\s*(?P<intr>{_HEX})(?:[\s,]+(?P<status>{_HEX}))?",
    re.IGNORECASE,
)
_NVLINK74 = re.compile(
    rf"\blink\s+(?P<link>\d{{1,3}})\s*\((?P<regs>{_HEX}(?:\s*,\s*{_HEX}){{0,15}})\)", re.IGNORECASE
)
_DRIVER = re.compile(r"^\s*(?:R)?(?P<major>\d{2,4})(?:\.\d{1,4}){0,3}\s*$")
COLUMNS = (
    "xid",
    "subcode",
    "intrinfo_v1",
    "intrinfo_v2",
    "error_status",
    "nvidia_action",
    "action2_intrinfo_v1",
    "action2_intrinfo_v2",
    "nvidia_action2",
    "nvidia_investigation",
    "severity",
    "hw_sw",
)


@dataclass(frozen=True, slots=True)
class Mask:
    """A 32-character bit pattern, bit 31 first: '0' and '1' must match, '-' may be anything."""

    care: int
    value: int

    @classmethod
    def parse(cls, pattern: str) -> Mask:
        if len(pattern) != 32 or set(pattern) - set("01-"):
            raise ValueError(f"{pattern[:40]!r} is not a 32-bit pattern of 0, 1 and -")
        care = int("".join("0" if c == "-" else "1" for c in pattern), 2)
        return cls(care, int(pattern.replace("-", "0"), 2))

    def matches(self, word: int) -> bool:
        return word & self.care == self.value


@dataclass(frozen=True, slots=True)
class Nvlink5Row:
    """One row of NVIDIA's table: which messages it matches, and what NVIDIA says of them."""

    xid: int
    subcode: str
    masks: dict[Generation, Mask]
    error_status: frozenset[int] | None  # None: any
    nvidia_action: str  # RESET_GPU, IGNORE, XID_154_EVAL
    action2_masks: dict[Generation, Mask] | None  # a promoted ("Non-fatal*") error takes action 2
    nvidia_action2: str
    nvidia_investigation: str
    severity: str  # as NVIDIA writes it: Fatal, Link Fatal, Non-fatal (with * or ** or ?)
    hw_sw: str

    def promoted(self, generation: Generation, intr_info: int) -> bool:
        return self.action2_masks is not None and self.action2_masks[generation].matches(intr_info)

    def matches(self, generation: Generation, intr_info: int, status: int) -> bool:
        mask = self.masks[generation].matches(intr_info) or self.promoted(generation, intr_info)
        return mask and (self.error_status is None or status in self.error_status)


def parse_nvlink5_table(text: str, *, source: str = "nvlink5 decode table") -> tuple[Nvlink5Row, ...]:
    """The decode table's rows; ConfigError names the line of the first bad one."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ConfigError(f"{source}: the header must be {','.join(COLUMNS)}")
    rows = []
    for line, row in enumerate(reader, start=2):
        try:
            rows.append(_row(row))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{source} line {line}: {e}") from None
    return tuple(rows)


def _row(row: dict[str, str]) -> Nvlink5Row:
    if None in row or any(v is None for v in row.values()):
        raise ValueError(f"expected {len(COLUMNS)} fields")
    status = row["error_status"].strip()
    statuses = frozenset(int(s, 16) for s in status.split("/")) if status else None
    promoted = row["action2_intrinfo_v1"].strip()
    return Nvlink5Row(
        xid=int(row["xid"]),
        subcode=row["subcode"].strip(),
        masks={"v1": Mask.parse(row["intrinfo_v1"]), "v2": Mask.parse(row["intrinfo_v2"])},
        error_status=statuses,
        nvidia_action=row["nvidia_action"].strip(),
        action2_masks=(
            {"v1": Mask.parse(promoted), "v2": Mask.parse(row["action2_intrinfo_v2"])} if promoted else None
        ),
        nvidia_action2=row["nvidia_action2"].strip(),
        nvidia_investigation=row["nvidia_investigation"].strip(),
        severity=row["severity"].strip(),
        hw_sw=row["hw_sw"].strip(),
    )


def load_nvlink5_table(path: Path) -> tuple[Nvlink5Row, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"nvlink5 decode table {path}: {e}") from e
    return parse_nvlink5_table(text, source=f"nvlink5 decode table {path}")


def generation_of(driver_version: str | None) -> Generation | None:
    """The message format a driver writes: V2 from R575; None where the version is unknown or unreadable."""
    match = _DRIVER.match(driver_version or "")
    if match is None:
        return None
    return "v2" if int(match["major"]) >= 575 else "v1"


@dataclass(frozen=True, slots=True)
class Nvlink5Message:
    unit: str  # the sub-unit as the message names it (NETIR_LINK_EVT, RLW_SRC_TRACK...)
    fatal_in_text: bool
    link: int
    intr_info: int
    error_status: int


def parse_nvlink5_message(message: str) -> Nvlink5Message | None:
    found = _NVLINK5.search(message[:_MAX_TEXT])
    if found is None:
        return None
    return Nvlink5Message(
        unit=found["unit"].upper(),
        fatal_in_text=found["fatal"].lower() == "fatal",
        link=int(found["link"]),
        intr_info=int(found["intr"], 16),
        error_status=int(found["status"], 16) if found["status"] else 0,
    )


@dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    """What the table says of one message: the row(s) it matched, in the generation it was read as."""

    generation: Generation
    message: Nvlink5Message
    rows: tuple[Nvlink5Row, ...]  # one, or one per set bit of errorStatus where no row has it whole
    promoted: bool  # a "Non-fatal*" error whose intrInfo asks for action 2

    @property
    def subcode(self) -> str:
        return " + ".join(dict.fromkeys(r.subcode for r in self.rows))


def decode_nvlink5(
    table: tuple[Nvlink5Row, ...], code: int, message: str, generation: Generation | None
) -> Nvlink5Decode | None:
    """The table's reading of one message, or None: unreadable, no row matches, or (the driver's
    generation unknown) both generations match differently."""
    parsed = parse_nvlink5_message(message)
    if parsed is None:
        return None
    chosen = named_generation(table, code, parsed.unit) or generation
    tried: tuple[Generation, ...] = (chosen,) if chosen else ("v1", "v2")
    found = [d for g in tried if (d := _decode_as(table, code, parsed, g)) is not None]
    if not found or any(d.rows != found[0].rows for d in found):
        return None
    return found[0]


def named_generation(table: tuple[Nvlink5Row, ...], code: int, unit: str) -> Generation | None:
    """The generation whose name for a sub-unit the message uses, where NVIDIA's table names it
    differently in each (`V1/V2`, e.g. NETIR/NETIR_INT); None where the name does not settle it."""
    said: set[Generation] = set()
    for row in table:
        if row.xid != code:
            continue
        v1, _, v2 = row.subcode.upper().partition("/")
        names: dict[Generation, str] = {"v1": v1.strip(), "v2": (v2 or v1).strip()}
        said |= {g for g, name in names.items() if name == unit}
    return next(iter(said)) if len(said) == 1 else None


def _decode_as(
    table: tuple[Nvlink5Row, ...], code: int, parsed: Nvlink5Message, generation: Generation
) -> Nvlink5Decode | None:
    rows = [r for r in table if r.xid == code]
    whole = [r for r in rows if r.matches(generation, parsed.intr_info, parsed.error_status)]
    if whole:
        if len({(r.nvidia_action, r.severity) for r in whole}) > 1:
            return None  # rows that disagree match the same message: do not guess
        chosen: tuple[Nvlink5Row, ...] = tuple(whole)
    else:  # several status bits at once: each bit must have its own row
        bits = [1 << b for b in range(32) if parsed.error_status >> b & 1]
        per_bit = [[r for r in rows if r.matches(generation, parsed.intr_info, bit)] for bit in bits]
        if not bits or any(len(matched) != 1 for matched in per_bit):
            return None
        chosen = tuple(matched[0] for matched in per_bit)
    promoted = any(r.promoted(generation, parsed.intr_info) for r in chosen)
    return Nvlink5Decode(generation, parsed, chosen, promoted)


# XID 74: NVIDIA's NVLink workflow, by register (0-based) and bit.
# Per NVIDIA's WORKFLOW_NVLINK_ERR (config/xid-catalog.csv, XID 74's reason, gives it bit by bit):
# ignorable; sympathetic (follow the other errors, report if alone); ecc_parity (report past 2 on a
# link); mechanical (check the link's connections, reseat); repeat_diagnose (if repeated: field
# diagnostics and a bug report); repeat_report (if repeated: a bug report); unexpected (a bug report).
NvlinkBitClass = Literal[
    "ignorable", "sympathetic", "ecc_parity", "mechanical", "repeat_diagnose", "repeat_report", "unexpected"
]
_BITS_74: dict[int, dict[int, NvlinkBitClass]] = {
    0: {0: "ignorable", 23: "ignorable", 30: "ignorable", 1: "sympathetic", 20: "sympathetic",
        4: "ecc_parity", 5: "ecc_parity", 8: "mechanical", 9: "mechanical", 12: "mechanical",
        16: "mechanical", 17: "mechanical", 24: "mechanical", 28: "mechanical", 21: "mechanical",
        22: "mechanical", 27: "repeat_report", 29: "repeat_report"},
    2: {0: "ecc_parity", 1: "ecc_parity", 2: "ecc_parity", 6: "ecc_parity", 13: "unexpected",
        16: "repeat_diagnose", 19: "repeat_diagnose", 17: "repeat_report", 18: "repeat_report"},
    3: {16: "sympathetic", 17: "sympathetic", 18: "sympathetic"},
    4: {18: "ecc_parity", 19: "ecc_parity", 21: "ecc_parity", 22: "ecc_parity", 24: "ecc_parity",
        25: "ecc_parity", 27: "ecc_parity", 28: "ecc_parity", 20: "ignorable", 23: "ignorable",
        26: "ignorable", 29: "ignorable"},
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Nvlink74Decode:
    link: int
    registers: tuple[int, ...]
    classes: dict[NvlinkBitClass, list[str]]  # class -> the set bits, as "reg<r>.bit<b>"


def decode_nvlink74(message: str) -> Nvlink74Decode | None:
    """The set bits of an XID 74's registers by NVIDIA's classes; None where the message has none."""
    found = _NVLINK74.search(message[:_MAX_TEXT])
    if found is None:
        return None
    registers = tuple(int(r, 16) for r in re.findall(_HEX, found["regs"]))
    classes: dict[NvlinkBitClass, list[str]] = {}
    for reg, word in enumerate(registers):
        for bit in range(32):
            if word >> bit & 1:
                kind = _BITS_74.get(reg, {}).get(bit, "unexpected")
                classes.setdefault(kind, []).append(f"reg{reg}.bit{bit}")
    return Nvlink74Decode(int(found["link"]), registers, classes)

"""The tamper-evident chain of gpu-verifications records: canonical bytes, hashes, and the audit.

Canonical serialisation (what every link hashes), for a record given as JSON:

1. parse the JSON value (UTF-8; NaN, Infinity and duplicate keys refused);
2. write it back as JSON with object keys sorted by Unicode code point, no
   whitespace (separators ``,`` and ``:``), strings as UTF-8 with only ``"``,
   ``\\``, and control characters escaped (``\\n``-style where JSON has a short
   form, ``\\u00XX`` otherwise), integers in decimal, and floats in their
   shortest round-trip form (Python's ``repr``: ``0.1``, ``1e-07``,
   ``1e+16``); ``true``/``false``/``null`` as JSON spells them;
3. the link is the lowercase hex SHA-256 of those bytes.

Each record carries ``prev_sha256``, the link of the previous record of the
same GPU (64 zeros for its first, ``seq`` 0), and ``seq``, its position in the
GPU's chain. Because the hash covers the whole previous record, including its
own ``prev_sha256``, changing, removing or inserting any record breaks the
link of the record after it. Producers write the canonical bytes; the audit
re-canonicalises what it reads, so only a change of content counts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared.plumbing.errors import ContractError

GENESIS = "0" * 64


def _refuse_constant(name: str) -> Any:
    raise ContractError(f"JSON constant {name} is not allowed in a chained record")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ContractError(f"duplicate key {key!r} in a chained record")
        out[key] = value
    return out


def parse_canonical_input(raw: bytes | str) -> dict[str, Any]:
    """The JSON object of a record, strictly parsed; ContractError when it is not one."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise ContractError(f"record is not UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise ContractError(f"record is not JSON: {e}") from e
    except RecursionError as e:
        raise ContractError("record nests too deeply") from e
    if not isinstance(value, dict):
        raise ContractError("record is not a JSON object")
    return value


def canonical_bytes(value: Any) -> bytes:
    """The canonical serialisation defined in the module docstring."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")  # a lone surrogate (JSON "\ud800") has no UTF-8: refused here
    except (ValueError, RecursionError) as e:
        raise ContractError(f"record cannot be serialised canonically: {e}") from e


def link_of(value: dict[str, Any]) -> str:
    """The SHA-256 (hex) of a record's canonical bytes: the next record's prev_sha256."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One record as read from the topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The newest record of one GPU's chain."""

    seq: int
    sha256: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class BrokenLink:
    gpu_uuid: str | None
    partition: int
    offset: int
    reason: str

    def describe(self) -> str:
        who = self.gpu_uuid or "unknown GPU"
        return f"{who} at partition {self.partition} offset {self.offset}: {self.reason}"


@dataclass(slots=True)
class AuditReport:
    records: int = 0
    heads: dict[str, ChainHead] = field(default_factory=dict)
    broken: list[BrokenLink] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.broken

    @property
    def first_broken(self) -> BrokenLink | None:
        return min(self.broken, key=lambda b: (b.partition, b.offset)) if self.broken else None


@dataclass(frozen=True, slots=True)
class _Linked:
    entry: ChainEntry
    seq: int
    prev: str
    link: str  # this record's own hash


def _identify(entry: ChainEntry) -> tuple[_Linked | None, str | None, str | None]:
    """(the record's chain fields, gpu_uuid, problem), checking only what chaining needs."""
    key = entry.key.decode("utf-8", "replace") if entry.key is not None else None
    if entry.value is None:
        return None, key, "record has no value"
    try:
        record = parse_canonical_input(entry.value)
        link = link_of(record)
    except ContractError as e:
        return None, key, str(e)
    uuid, seq, prev = record.get("gpu_uuid"), record.get("seq"), record.get("prev_sha256")
    if not isinstance(uuid, str) or not uuid:
        return None, key, "record has no gpu_uuid"
    if key != uuid:
        return None, key or uuid, f"message key {key!r} is not the record's gpu_uuid {uuid!r}"
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        return None, uuid, f"seq {seq!r} is not a non-negative integer"
    if not isinstance(prev, str) or len(prev) != 64 or prev.strip("0123456789abcdef"):
        return None, uuid, f"prev_sha256 {prev!r} is not 64 lowercase hex digits"
    return _Linked(entry, seq, prev, link), uuid, None


def verify_chain(entries: Iterable[ChainEntry]) -> AuditReport:
    """Walk every GPU's chain and report each broken link.

    Entries of one partition must come in offset order. A GPU's records are all
    in one partition unless the topic's partitions were increased; then its
    partitions are taken in the order of the `seq` of their first record. After
    a break the walk continues from the record that broke it, so every later
    break is reported too, not only the first.
    """
    report = AuditReport()
    per_gpu: dict[str, dict[int, list[_Linked]]] = {}
    for entry in entries:
        report.records += 1
        linked, uuid, problem = _identify(entry)
        if problem is not None or linked is None or uuid is None:
            report.broken.append(BrokenLink(uuid, entry.partition, entry.offset, problem or "unreadable"))
            continue
        per_gpu.setdefault(uuid, {}).setdefault(entry.partition, []).append(linked)
    for uuid, partitions in per_gpu.items():
        ordered = sorted(partitions.values(), key=lambda items: items[0].seq)
        head: ChainHead | None = None
        for item in (item for items in ordered for item in items):
            entry, seq, prev = item.entry, item.seq, item.prev
            problem = None
            if head is None:
                if seq != 0 or prev != GENESIS:
                    problem = f"the chain starts at seq {seq}, not at its genesis record (seq 0)"
            elif prev != head.sha256:
                problem = (
                    f"prev_sha256 {prev[:16]}… does not match the previous record's hash "
                    f"{head.sha256[:16]}… (seq {head.seq}, offset {head.offset}): "
                    "a record was changed, removed or inserted"
                )
            elif seq != head.seq + 1:
                problem = f"seq {seq} does not follow seq {head.seq}"
            if problem is not None:
                report.broken.append(BrokenLink(uuid, entry.partition, entry.offset, problem))
            head = ChainHead(seq, item.link, entry.partition, entry.offset)
        if head is not None:
            report.heads[uuid] = head
    report.broken.sort(key=lambda b: (b.partition, b.offset))
    return report

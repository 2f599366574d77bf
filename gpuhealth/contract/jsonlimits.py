"""Bounds on a record's size and nesting depth, checked on its raw bytes before any parser sees it.

A JSON parser recurses once per nesting level: a few kilobytes of ``[[[[...``
make Python's ``json`` raise RecursionError and cost any parser time and
memory. The contract's messages nest three levels at most (a sample, its MIG
list, one instance), so anything deeper than MAX_JSON_DEPTH is refused here,
with a ContractError, by a linear scan that never recurses.
"""

from __future__ import annotations

from gpuhealth.errors import ContractError

# The broker's default message.max.bytes: no producer of the contract sends more.
MAX_RECORD_BYTES = 1_000_000
# Generous next to the contract's own 3 levels, far below any parser's recursion limit.
MAX_JSON_DEPTH = 16

_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def check_bounds(
    raw: bytes | str, max_bytes: int = MAX_RECORD_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> None:
    """ContractError if `raw` is longer than `max_bytes` or nests arrays/objects deeper than `max_depth`.

    Brackets inside JSON strings do not count. The scan is linear in the size of the
    record whatever it holds (it works on bytes, C-speed, and stops at the first level too deep).
    """
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise ContractError(f"record of {len(data)} bytes exceeds {max_bytes}")
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return  # the common case: too few brackets to nest that deep, wherever they are
    # Escaped backslashes first (JSON pairs them from the left), then escaped quotes: every
    # quote left delimits a string, and every other piece between quotes is outside one.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    depth = 0
    for c in outside.translate(None, _NOT_BRACKETS):
        if c in _OPEN:
            depth += 1
            if depth > max_depth:
                raise ContractError(f"JSON nested deeper than {max_depth} levels")
        elif c in _CLOSE:
            depth -= 1

"""What every API answer shares: opaque keyset cursors, totals, one time format, empty collections as [].

A list answers `{<items>: [...], "total": n, "limit": l, "next_cursor": c}`:
`total` counts everything the filters match (not only this page) and
`next_cursor` is null on the last page; passing it back as `cursor` continues
right after the last item returned, so rows arriving meanwhile neither repeat
nor shift the pages (keyset, not offset). A cursor is base64url JSON of the
last row's sort key; one that does not decode to what the endpoint expects is
a 400 naming the parameter.

Times are always UTC with microseconds and a `Z` (`2026-05-01T12:00:00.000000Z`),
whatever the database session's time zone: :func:`z_time`, which the answers'
time fields (services.api.answers.ApiTime) serialise with.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException


def z_time(value: datetime) -> str:
    """The API's time format: always four year digits (strftime's %Y writes 999, not the RFC 3339
    0999) and six fraction digits (the topics' is gpuhealth.contract.wire_time)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    v = value.astimezone(UTC)
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
        f".{v.microsecond:06d}Z"
    )


def encode_cursor(key: Sequence[Any]) -> str:
    plain = [z_time(v) if isinstance(v, datetime) else v for v in key]
    return base64.urlsafe_b64encode(json.dumps(plain, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, kinds: Sequence[type]) -> list[Any]:
    """The sort key in `cursor`, each part converted by its kind (`int`, `float`, `str` or `datetime`)."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(raw, list) or len(raw) != len(kinds):
            raise ValueError("wrong length")
        return [_convert(kind, part) for kind, part in zip(kinds, raw, strict=True)]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, OverflowError):
        raise HTTPException(400, "'cursor' is not one this endpoint returned; start without it") from None


def _convert(kind: type, part: Any) -> Any:
    if kind is datetime:
        if not isinstance(part, str):
            raise ValueError("not a time")
        parsed = datetime.fromisoformat(part)
        if parsed.tzinfo is None:
            raise ValueError("no zone")
        return parsed
    if kind is int and (not isinstance(part, int) or isinstance(part, bool) or abs(part) > 2**62):
        raise ValueError("not an integer")
    if kind is float and (not isinstance(part, int | float) or isinstance(part, bool)):
        raise ValueError("not a number")
    if kind is str and not isinstance(part, str):
        raise ValueError("not text")
    if kind is str and ("\x00" in part or len(part) > 256):
        raise ValueError("bad text")
    return kind(part)


def page(
    name: str,
    found: Sequence[Mapping[str, Any]],
    *,
    total: int,
    limit: int,
    key: Callable[[Any], Sequence[Any]],
) -> dict[str, Any]:
    """One page of `limit` items out of `found` (fetched with limit + 1 to know whether more follow)."""
    more = len(found) > limit
    items = found[:limit]
    return {
        name: items,
        "total": total,
        "limit": limit,
        "next_cursor": encode_cursor(key(items[-1])) if more and items else None,
    }

"""Messages straight into binary COPY rows, with no Python object per field.

The sink's hot path decodes a message into Python values (shared.fastdecode)
only for psycopg to encode them again into PostgreSQL's binary COPY format.
This module does both at once, in C (`_fastcopy.c`): a lane's messages become
the bytes of the COPY into the table, the COPY rows of each GPU's newest
sample (for gpu_latest and gpu_assets), and each row's time.

Like fastdecode it is a fast path, never an authority: it is compiled from the
contract's own JSON Schema, and it declines the whole batch (None) unless every
message is certainly valid and in the plain form it knows. Then the caller
takes its other paths, which decide each message and name the reason for a
refusal. What it encodes is byte for byte what psycopg would send for the row
pydantic gives (a unit test checks that on hostile and random messages). It
declines:

- strings with escapes, control characters or anything but printable ASCII
  (so a pattern that forbids control characters holds by construction; the
  key column's own pattern is checked here, once per distinct value);
- unknown or repeated keys, nested values, an array that is not empty (MIG
  instances), ``true``/``false``;
- numbers it cannot convert exactly as Python does (it converts a plain one
  itself and hands the rest to Python's correctly rounded parser), an integer
  for a float column past 2^53, anything out of bounds;
- times outside the plain RFC 3339 form fastdecode takes, or outside the
  caller's bounds; a time is cut to milliseconds as the contract does.

The extension is built by ``make venv`` (scripts/pyenv.sh) where a C compiler
is at hand. Where it is not (a slim container), `compiled()` is None and the
sink decodes with fastdecode instead: the same rows, at a few µs more a row.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

from shared.fastdecode import BOUNDS, NOTES, JsonSchema, SchemaNotSupportedError, python_pattern
from shared.jsonlimits import MAX_RECORD_BYTES

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # binary COPY counts time from here, in µs

# Column kinds, as _fastcopy.c numbers them, and the PostgreSQL type each is sent as.
TIME, TEXT, FLOAT8, INT8, INT2, EMPTY_ARRAY = range(6)
_PG_TYPES = {
    TIME: "timestamptz", TEXT: "text", FLOAT8: "double precision", INT8: "bigint", INT2: "smallint",
    EMPTY_ARRAY: "jsonb",
}  # fmt: skip
_INT_RANGE = {INT8: (-(2**63), 2**63 - 1), INT2: (-(2**15), 2**15 - 1)}
# The one string pattern the C side holds by construction: it takes printable ASCII only.
_NO_CONTROL = "^[^\\x00-\\x1f\\x7f]*$"


def compiled() -> ModuleType | None:
    """The C extension, or None where it was not built (then callers take their other path)."""
    try:
        return importlib.import_module("shared._fastcopy")
    except ImportError:
        return None


def as_time(us: int) -> datetime:
    """A time the encoder gave (µs since 2000-01-01 UTC) as a datetime."""
    return PG_EPOCH + timedelta(microseconds=us)


def as_us(time: datetime) -> int:
    return (time - PG_EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Encoded:
    """A batch of messages in binary COPY form."""

    table_rows: bytes  # every row's first `width` columns, in message order, each with its field count
    # per key (in the order they first appear): its newest row (the first of equals), every
    # column, with the time of its oldest row appended, and its field count
    latest_rows: bytes
    keys: list[str]  # those keys
    times: Sequence[int]  # each row's time, µs since 2000-01-01 UTC (as_time), in message order

    def __len__(self) -> int:
        return len(self.times)


class CopyEncoder:
    """Encodes messages of a closed, flat JSON Schema into binary COPY rows, or declines."""

    def __init__(
        self,
        module: ModuleType,
        schema: JsonSchema,
        columns: Sequence[str],
        types: Sequence[str],
        *,
        width: int,
        key: str,
        time: str,
        time_bounds: Callable[[], tuple[datetime, datetime]],
    ) -> None:
        """`columns`/`types`: every property of `schema`, in COPY order, with its PostgreSQL
        type; the first `width` are the table's. `key`: the text column a message key must
        equal; `time`: the time column, whose allowed range `time_bounds` gives (inclusive).
        SchemaNotSupportedError names what in the schema this cannot translate."""
        if sorted(columns) != sorted(schema.get("properties", {})):
            raise SchemaNotSupportedError("the columns must name every property of the schema once")
        if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
            raise SchemaNotSupportedError("only closed objects (additionalProperties: false)")
        required = set(schema.get("required", ()))
        defs = schema.get("$defs", {})
        self._key_pattern: re.Pattern[str] | None = None
        specs = []
        for name, pg_type in zip(columns, types, strict=True):
            spec, pattern = _column(name, schema["properties"][name], name in required, defs, pg_type)
            if pattern is not None:
                if name != key:
                    raise SchemaNotSupportedError(f"{name}: pattern {pattern!r} (only the key's is checked)")
                self._key_pattern = re.compile(python_pattern(pattern))
            specs.append(spec)
        self._module = module
        self._spec = module.compile(specs, width, columns.index(key), columns.index(time))
        self._time_bounds = time_bounds
        self._keys_seen: set[str] = set()

    def encode(self, values: list[bytes], keys: list[bytes | None]) -> Encoded | None:
        """The messages as COPY rows, or None if any one is declined. A key, where not None,
        must equal the message's key column; the latest rows have one more column than the
        spec's (first_seen, a time)."""
        earliest, latest = self._time_bounds()
        # longer records the contract refuses (shared.jsonlimits)
        out = self._module.encode(self._spec, values, keys, as_us(earliest), as_us(latest), MAX_RECORD_BYTES)
        if out is None:
            return None
        table_rows, latest_rows, latest_keys, times = out
        encoded = Encoded(table_rows, latest_rows, latest_keys, memoryview(times).cast("q"))
        if self._key_pattern is not None:
            new = set(encoded.keys) - self._keys_seen
            if not all(map(self._key_pattern.match, new)):
                return None
            if len(self._keys_seen) > 100_000:  # a bound on memory, far above a fleet's GPUs
                self._keys_seen.clear()
            self._keys_seen |= new
        return encoded


def _column(
    name: str, s: JsonSchema, required: bool, defs: JsonSchema, pg_type: str
) -> tuple[tuple[Any, ...], str | None]:
    """One property, sent as `pg_type`, as the C side's column spec, and the pattern it leaves
    to the caller."""
    nullable = False
    if "anyOf" in s:
        others = [o for o in s["anyOf"] if o != {"type": "null"}]
        if len(others) != 1 or len(s["anyOf"]) != 2 or set(s) - NOTES - {"anyOf"}:
            raise SchemaNotSupportedError(f"{name}: anyOf other than 'X or null'")
        if s.get("default", None) is not None:
            raise SchemaNotSupportedError(f"{name}: a default other than null")
        nullable, s = True, others[0]
    elif not required and s.get("type") != "array" and s.get("default", ...) is not None:
        raise SchemaNotSupportedError(f"{name}: optional without a null default")
    if "$ref" in s:
        s = defs[s["$ref"].removeprefix("#/$defs/")]
    s = {k: v for k, v in s.items() if k not in NOTES}
    integer = INT2 if pg_type == "smallint" else INT8
    kind, ints, floats, lengths, enum, pattern = TEXT, (0, 0), (0.0, 0.0, False, False), (0, -1), (), None
    match s:
        case {"const": int() as value, **rest} if set(rest) <= {"type"} and type(value) is int:
            kind, ints = integer, (value, value)
        case {"enum": list(values), **rest} if set(rest) <= {"type"} and all(type(v) is str for v in values):
            enum = tuple(v.encode("ascii") for v in values)
        case {"type": "string", "format": "date-time"} if len(s) == 2:
            kind = TIME
        case {"type": "string", **rest} if set(rest) <= {"minLength", "maxLength", "pattern"}:
            lengths = (rest.get("minLength", 0), rest.get("maxLength", -1))
            if rest.get("pattern", _NO_CONTROL) != _NO_CONTROL:
                pattern = rest["pattern"]
        case {"type": "integer", **rest} if set(rest) <= BOUNDS.keys():
            kind, ints = integer, _int_bounds(name, rest)
        case {"type": "number", **rest} if set(rest) <= BOUNDS.keys():
            kind, floats = FLOAT8, _float_bounds(name, rest)
        case {"type": "array", **rest} if set(rest) <= {"items", "minItems", "maxItems"} and not required:
            if rest.get("minItems", 0) > 0:
                raise SchemaNotSupportedError(f"{name}: an array that may not be empty")
            kind = EMPTY_ARRAY
        case _:
            raise SchemaNotSupportedError(f"{name}: {s}")
    if _PG_TYPES[kind] != pg_type:
        raise SchemaNotSupportedError(f"{name}: sent as {pg_type}, but the schema makes it {_PG_TYPES[kind]}")
    if kind in _INT_RANGE and not (_INT_RANGE[kind][0] <= ints[0] <= ints[1] <= _INT_RANGE[kind][1]):
        raise SchemaNotSupportedError(f"{name}: bounds {ints} do not fit {pg_type}")
    return (name.encode(), kind, required, nullable, *ints, *floats, *lengths, enum), pattern


def _int_bounds(name: str, s: JsonSchema) -> tuple[int, int]:
    if not all(type(v) is int for v in s.values()):
        raise SchemaNotSupportedError(f"{name}: integer bounds that are not integers")
    low = max(s.get("minimum", -(2**63)), s.get("exclusiveMinimum", -(2**63) - 1) + 1)
    high = min(s.get("maximum", 2**63 - 1), s.get("exclusiveMaximum", 2**63) - 1)
    return max(low, -(2**63)), min(high, 2**63 - 1)


def _float_bounds(name: str, s: JsonSchema) -> tuple[float, float, bool, bool]:
    for bound in s.values():
        if type(bound) not in (int, float) or float(bound) != bound:
            raise SchemaNotSupportedError(f"{name}: a bound {bound!r} that is not exactly a double")
    if {"minimum", "exclusiveMinimum"} <= set(s) or {"maximum", "exclusiveMaximum"} <= set(s):
        raise SchemaNotSupportedError(f"{name}: two lower or two upper bounds")
    low, high = s.get("minimum", s.get("exclusiveMinimum")), s.get("maximum", s.get("exclusiveMaximum"))
    return (
        -math.inf if low is None else float(low), math.inf if high is None else float(high),
        "exclusiveMinimum" in s, "exclusiveMaximum" in s,
    )  # fmt: skip

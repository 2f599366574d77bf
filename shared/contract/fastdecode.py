"""A fast first pass over the contract, compiled from the contract's own JSON Schema.

The sink validates every message. pydantic's strict model (shared.contract.models) is the
contract and says *why* a message is refused, but costs ~20 µs a message. This
module compiles the JSON Schema pydantic generates for a model into a msgspec
Struct, which checks the same types and bounds in a few µs.

It is a fast path, never a second authority: whatever it does not accept, the
caller hands to pydantic, which accepts it (slowly) or refuses it with a reason.
So it only has to be *no more lenient* than pydantic, and give the same values
for what it accepts (one exception: an absent optional array is None, where
pydantic gives []). Where the two could differ it declines:

- regex patterns: pydantic anchors ``$`` at the very end; Python's ``$`` also
  matches before a final newline, so ``$`` is compiled as ``\\Z``;
- ``date-time`` strings: only the plain RFC 3339 form
  (``2026-11-21T10:00:00.123Z`` or a ``±hh:mm`` offset, up to 6 fractional
  digits) is parsed here, by the decoder's hook as it meets them; anything
  else goes to pydantic. The model's own time check then runs on the result.

Schema keywords it does not know make compilation fail, so a new construct in
the contract cannot be skipped silently. A unit test compares it with pydantic
on hostile and randomly generated messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Annotated, Any, Literal

import msgspec

from gpuhealth.contract.jsonlimits import MAX_RECORD_BYTES

JsonSchema = dict[str, Any]

# Keywords that document rather than constrain.
_NOTES = {"title", "description", "default", "examples"}
_BOUNDS = {"minimum": "ge", "maximum": "le", "exclusiveMinimum": "gt", "exclusiveMaximum": "lt"}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


class SchemaNotSupportedError(ValueError):
    """The JSON Schema uses something this compiler does not translate."""


class DecodedTime(datetime):
    """A ``date-time`` field's value, parsed by FastDecoder's own hook.

    A subclass, so that msgspec hands the string to the hook: it would parse a plain
    datetime itself, and round where pydantic truncates.
    """


def python_pattern(pattern: str) -> str:
    """A JSON Schema (pydantic/Rust) pattern for Python's re: '$' means the very end."""
    body = pattern[:-1] if pattern.endswith("$") and not pattern.endswith("\\$") else None
    if body is None or "$" in body.replace("\\$", ""):
        raise SchemaNotSupportedError(f"pattern {pattern!r}: only a final '$' anchor is translated")
    return body + r"\Z"


def _check_keys(schema: JsonSchema, allowed: set[str]) -> None:
    unknown = set(schema) - allowed - _NOTES
    if unknown:
        raise SchemaNotSupportedError(f"unsupported JSON Schema keywords {sorted(unknown)} in {schema}")


class _Compiler:
    def __init__(self, defs: dict[str, JsonSchema]) -> None:
        self.defs = defs
        self.structs: dict[str, type[msgspec.Struct]] = {}

    def type_of(self, s: JsonSchema, patterns: dict[str, str] | None = None, field: str = "") -> Any:
        """The msgspec type for one schema; with `patterns`, string patterns are left to the caller."""
        if "$ref" in s:
            _check_keys(s, {"$ref"})
            name = s["$ref"].removeprefix("#/$defs/")
            target = self.defs[name]
            return self.struct(name, target) if target.get("type") == "object" else self.type_of(target)
        if "anyOf" in s:
            _check_keys(s, {"anyOf"})
            others = [o for o in s["anyOf"] if o != {"type": "null"}]
            if len(others) != 1 or len(s["anyOf"]) != 2:
                raise SchemaNotSupportedError(f"anyOf other than 'X or null': {s}")
            return self.type_of(others[0], patterns, field) | None
        if "const" in s:
            _check_keys(s, {"const", "type"})
            return Literal[s["const"]]
        if "enum" in s:
            _check_keys(s, {"enum", "type"})
            return Literal[tuple(s["enum"])]
        kind = s.get("type")
        if kind in ("integer", "number"):
            _check_keys(s, {"type", *_BOUNDS})
            meta = msgspec.Meta(**{_BOUNDS[k]: v for k, v in s.items() if k in _BOUNDS})
            number: type = int if kind == "integer" else float
            return Annotated[number, meta]
        if kind == "string":
            _check_keys(s, {"type", "minLength", "maxLength", "pattern", "format"})
            if s.get("format", "date-time") != "date-time":
                raise SchemaNotSupportedError(f"string format {s['format']!r}")
            if "format" in s:
                if set(s) & {"minLength", "maxLength", "pattern"}:
                    raise SchemaNotSupportedError(f"constraints on a date-time: {s}")
                return DecodedTime
            pattern = python_pattern(s["pattern"]) if "pattern" in s else None
            if pattern is not None and patterns is not None:
                patterns[field], pattern = pattern, None
            lengths = {"min_length": s.get("minLength"), "max_length": s.get("maxLength")}
            return Annotated[str, msgspec.Meta(**lengths, pattern=pattern)]
        if kind == "array":
            _check_keys(s, {"type", "items", "minItems", "maxItems"})
            meta = msgspec.Meta(min_length=s.get("minItems"), max_length=s.get("maxItems"))
            return Annotated[list[self.type_of(s["items"])], meta]  # type: ignore[misc]
        raise SchemaNotSupportedError(f"unsupported schema {s}")

    def struct(
        self,
        name: str,
        s: JsonSchema,
        order: Sequence[str] = (),
        patterns: dict[str, str] | None = None,
        namespace: dict[str, Any] | None = None,
    ) -> type[msgspec.Struct]:
        if name in self.structs:
            return self.structs[name]
        _check_keys(s, {"type", "properties", "required", "additionalProperties", "$defs"})
        if s.get("type") != "object" or s.get("additionalProperties") is not False:
            raise SchemaNotSupportedError(f"{name}: only closed objects (additionalProperties: false)")
        props: dict[str, JsonSchema] = s["properties"]
        if order and sorted(order) != sorted(props):
            raise SchemaNotSupportedError(f"{name}: the order must name each property once: {order}")
        required = set(s.get("required", ()))
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for field in order or props:
            spec = props[field]
            kind = self.type_of(spec, patterns, field)
            if field in required:
                fields.append((field, kind))
            elif spec.get("type") == "array":
                fields.append((field, kind, None))  # absent: None (pydantic's default is [])
            else:
                fields.append((field, kind, spec.get("default")))
        # gc=False: decoded messages hold no reference cycles, and tracking them costs time.
        struct = msgspec.defstruct(
            name, fields, kw_only=True, forbid_unknown_fields=True, gc=False, namespace=namespace
        )
        self.structs[name] = struct
        return struct


astuple = msgspec.structs.astuple
_SEEN_LIMIT = 100_000  # checks remembered, per kind: a bound on memory, far above a fleet's GPUs


class FastDecoder:
    """Decodes JSON into a tuple of its fields in a given order, or returns None to defer to pydantic."""

    def __init__(
        self,
        schema: JsonSchema,
        order: Sequence[str],
        time_check: Callable[[datetime], datetime],
        finish: Callable[[Any], None] | None = None,
    ) -> None:
        """`finish`, if given, is called on each decoded message (a msgspec Struct) as msgspec
        builds it: the caller's own conversions of its fields, in place."""
        compiler = _Compiler(schema.get("$defs", {}))
        patterns: dict[str, str] = {}
        namespace = {"__post_init__": finish} if finish is not None else None
        top = compiler.struct(str(schema.get("title", "Message")), schema, order, patterns, namespace)
        self._decoder = msgspec.json.Decoder(top, dec_hook=self._decode_time)
        self.fields: tuple[str, ...] = top.__struct_fields__
        # The fields with a pattern, read together: a fleet repeats the same combination of
        # hostname, model, cluster... for every sample of a GPU, so each is checked once.
        checks = sorted((self.fields.index(f), re.compile(p)) for f, p in patterns.items())
        self._checks = [(n, regex) for n, (_, regex) in enumerate(checks)]
        positions = [i for i, _ in checks]
        # itemgetter gives a bare value for a single position: asking for the first one again
        # keeps the result a tuple (its extra last item is never checked).
        self._labels: Callable[[tuple[Any, ...]], tuple[Any, ...]] = (
            itemgetter(*positions, *positions[:1]) if positions else (lambda _: ())
        )
        self._labels_seen: set[tuple[Any, ...]] = set()
        self._time_check = time_check
        self._times_seen: dict[str, DecodedTime] = {}  # a fleet's samples share their poll times

    def decode(self, raw: bytes | str) -> tuple[Any, ...] | None:
        """The message's fields in `fields` order (nested objects as msgspec Structs), or None."""
        if len(raw) > MAX_RECORD_BYTES:  # refused by the contract (gpuhealth.contract.jsonlimits)
            return None
        try:
            values: tuple[Any, ...] = astuple(self._decoder.decode(raw))
            labels = self._labels(values)
            if labels not in self._labels_seen:
                self._check_labels(labels)
        except (msgspec.DecodeError, ValueError, RecursionError):  # ValidationError is a DecodeError
            return None
        return values

    def decode_many(self, raws: Iterable[bytes | str]) -> list[tuple[Any, ...]] | None:
        """Every message decoded as `decode` would, or None if any one of them would be declined.

        For a batch: msgspec and map pass over the whole batch rather than a Python call per message.
        """
        raws = list(raws)
        if raws and max(map(len, raws)) > MAX_RECORD_BYTES:
            return None
        try:
            values = list(map(astuple, map(self._decoder.decode, raws)))
            for labels in set(map(self._labels, values)) - self._labels_seen:
                self._check_labels(labels)
        except (msgspec.DecodeError, ValueError, RecursionError):
            return None
        return values

    def _decode_time(self, kind: type, value: Any) -> DecodedTime:
        """msgspec's hook for date-time fields; ValueError or TypeError declines the message."""
        if kind is not DecodedTime or type(value) is not str:
            raise TypeError(f"expected a date-time string, got {type(value).__name__}")
        return self._times_seen.get(value) or self._check_time(value)

    def _check_time(self, text: str) -> DecodedTime:
        valid = self._time_check(_parse_time(text))
        checked = DecodedTime.combine(valid.date(), valid.timetz())
        if len(self._times_seen) > _SEEN_LIMIT:
            self._times_seen.clear()
        self._times_seen[text] = checked
        return checked

    def _check_labels(self, labels: tuple[Any, ...]) -> None:
        for n, regex in self._checks:
            if labels[n] is not None and not regex.search(labels[n]):
                raise ValueError(f"{labels[n]!r} does not match {regex.pattern!r}")
        if len(self._labels_seen) > _SEEN_LIMIT:
            self._labels_seen.clear()
        self._labels_seen.add(labels)


def _parse_time(text: str) -> datetime:
    if not _RFC3339.fullmatch(text):
        raise ValueError(f"{text!r} is not plain RFC 3339")
    return datetime.fromisoformat(text)


def as_builtins(value: Any) -> Any:
    """Nested Structs (e.g. MIG instances) as plain dicts and lists, as pydantic's model_dump gives."""
    return msgspec.to_builtins(value)

"""BACKWARD compatibility of two JSON Schemas, as Karapace and the Confluent schema registry define it.

A new schema is BACKWARD compatible with an old one when a reader using the new schema can read
everything written with the old one: every value the old schema accepts, the new one accepts. A
change that breaks that needs a new version, a new file (``gpu-sample.v2.schema.json``); within one
``.vN`` file every change must be compatible. tests/unit/shared/contract/test_schema_history.py
checks each committed file's history with :func:`incompatibilities`.

The rules are a table over the keywords this project's schemas use (``python -m
shared.contract.topic_registry`` writes them from the pydantic models). A keyword the table does not
know is compared for equality: an unknown change is taken as incompatible, never waved through.

No kept library on PyPI fits (checked 2026-11): ``jsoncompat`` needs Python 3.12 (the project runs
3.11) and Karapace is a whole server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Schema = Mapping[str, Any] | bool
# Words only for people (and the generator's defaults): they never change what is accepted.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated"})
# An upper bound may grow or go; it may not shrink or appear.
UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
# A lower bound may shrink or go; it may not grow or appear.
LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
# Compared as wholes: the same, or gone (a constraint removed only widens).
WHOLE = ("pattern", "format", "const", "if", "else", "not", "uniqueItems")
# Read with the structure around them (below).
STRUCTURE = frozenset(
    {"type", "enum", "required", "properties", "additionalProperties", "patternProperties"}
    | {"propertyNames", "items", "anyOf", "oneOf", "allOf", "then", "$ref", "$defs", "definitions"}
)
KNOWN = ANNOTATIONS | STRUCTURE | set(UPPER) | set(LOWER) | set(WHOLE)


class _Pair:
    """The two documents, each for resolving its own ``$ref``s, and the references being compared."""

    def __init__(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.old, self.new = old, new
        self.seen: set[tuple[str, str]] = set()


def incompatibilities(old: Schema, new: Schema) -> list[str]:
    """Why a reader with `new` cannot read what `old` accepts ([] when BACKWARD compatible)."""
    pair = _Pair(old if isinstance(old, Mapping) else {}, new if isinstance(new, Mapping) else {})
    return list(_compare(pair, old, new, "#"))


def _resolve(document: Mapping[str, Any], schema: Schema) -> tuple[Schema, str | None]:
    if isinstance(schema, Mapping) and isinstance(ref := schema.get("$ref"), str):
        if not ref.startswith("#/"):
            raise ValueError(f"only local $refs are read, not {ref!r}")
        target: Any = document
        for part in ref[2:].split("/"):
            target = target[part]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return ({**target, **rest} if rest else target), ref
    return schema, None


def _compare(pair: _Pair, old: Schema, new: Schema, at: str) -> Iterator[str]:
    old, old_ref = _resolve(pair.old, old)
    new, new_ref = _resolve(pair.new, new)
    if old_ref is not None or new_ref is not None:
        seen = (old_ref or at, new_ref or at)
        if seen in pair.seen:  # a recursive schema: this pair is being compared above
            return
        pair.seen.add(seen)
    if new is True or new == {} or old is False:
        return
    if new is False or old is True or old == {}:
        yield f"{at}: the new schema refuses values the old one accepts"
        return
    assert isinstance(old, Mapping)
    assert isinstance(new, Mapping)
    if _branches(old) or _branches(new):
        yield from _compare_branches(pair, old, new, at)
        return
    for rule in RULES:
        yield from rule(pair, old, new, at)


def _branches(schema: Mapping[str, Any]) -> list[Schema]:
    return list(schema.get("anyOf", ())) + list(schema.get("oneOf", ()))


def _compare_branches(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    """Each of the old's alternatives must be read by one of the new's."""
    shared = {k: v for k, v in old.items() if k not in ("anyOf", "oneOf")}
    olds = [{**shared, **b} if isinstance(b, Mapping) else b for b in _branches(old)] or [shared]
    new_shared = {k: v for k, v in new.items() if k not in ("anyOf", "oneOf")}
    news = [{**new_shared, **b} if isinstance(b, Mapping) else b for b in _branches(new)] or [new_shared]
    for i, branch in enumerate(olds):
        if not any(not list(_compare(pair, branch, n, f"{at}/anyOf/{i}")) for n in news):
            first = list(_compare(pair, branch, news[0], f"{at}/anyOf/{i}"))
            yield f"{at}/anyOf/{i}: no alternative of the new schema reads it" + (
                f" ({first[0]})" if len(news) == 1 and first else ""
            )


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _type_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    old_types, new_types = _types(old), _types(new)
    if new_types is None:
        return
    if old_types is None:
        yield f"{at}: a type is required ({sorted(new_types)}) where any was read"
        return
    if "number" in new_types:
        new_types = new_types | {"integer"}
    if lost := old_types - new_types:
        yield f"{at}: type {sorted(lost)} no longer read"


def _enum_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    if "enum" not in new:
        return
    if "enum" not in old:
        yield f"{at}: an enum ({len(new['enum'])} values) where any value was read"
        return
    kept = {json.dumps(v, sort_keys=True) for v in new["enum"]}
    if lost := [v for v in old["enum"] if json.dumps(v, sort_keys=True) not in kept]:
        yield f"{at}: enum values {lost} no longer read"


def _bounds_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    for word in UPPER + LOWER:
        if word not in new:
            continue
        if word not in old:
            yield f"{at}: {word} {new[word]} added"
        elif (new[word] < old[word]) if word in UPPER else (new[word] > old[word]):
            yield f"{at}: {word} {old[word]} -> {new[word]}"


def _whole_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    for word in (*WHOLE, *(set(new) - KNOWN)):
        if word in new and (word not in old or _text(old[word]) != _text(new[word])):
            yield f"{at}: {word} {'changed' if word in old else 'added'}"


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _required_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    if added := sorted(set(new.get("required", ())) - set(old.get("required", ()))):
        yield f"{at}: newly required {added}"


def _properties_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    """Each property the old schema may carry must be read by the new one, wherever it lands there."""
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    for name in sorted(set(old_props) | set(new_props)):
        # where a name the new schema lists sat in the old one: its own, a pattern's or additionalProperties
        for target in _slots(new, name):
            yield from _compare(pair, _slots(old, name)[0], target, f"{at}/properties/{name}")
    old_patterns, new_patterns = old.get("patternProperties", {}), new.get("patternProperties", {})
    for pattern, schema in old_patterns.items():
        target = new_patterns.get(pattern, new.get("additionalProperties", True))
        yield from _compare(pair, schema, target, f"{at}/patternProperties/{pattern}")
    for pattern in sorted(set(new_patterns) - set(old_patterns)):
        old_rest = old.get("additionalProperties", True)
        yield from _compare(pair, old_rest, new_patterns[pattern], f"{at}/patternProperties/{pattern}")
    if "additionalProperties" in new:
        old_rest = old.get("additionalProperties", True)
        yield from _compare(pair, old_rest, new["additionalProperties"], f"{at}/additionalProperties")
    if "propertyNames" in new:
        yield from _compare(pair, old.get("propertyNames", True), new["propertyNames"], f"{at}/propertyNames")


def _slots(schema: Mapping[str, Any], name: str) -> list[Schema]:
    """The schemas a property of this name must meet in an object of `schema` (JSON Schema's order)."""
    if name in schema.get("properties", {}):
        return [schema["properties"][name]]
    matched = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, name)]
    return matched or [schema.get("additionalProperties", True)]


def _items_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    if "items" in new:
        yield from _compare(pair, old.get("items", True), new["items"], f"{at}/items")


def _conditions_rule(pair: _Pair, old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> Iterator[str]:
    """``allOf`` part by part, and a ``then`` under the same ``if`` (changed ``if``s are `_whole_rule`'s)."""
    if "then" in new and _text(old.get("if")) == _text(new.get("if")):
        yield from _compare(pair, old.get("then", True), new["then"], f"{at}/then")
    elif "then" in new:
        yield f"{at}/then: under a changed if"
    if "allOf" not in new:
        return
    olds = list(old.get("allOf", ()))
    if len(olds) != len(new["allOf"]):
        yield f"{at}: allOf of {len(olds)} parts -> {len(new['allOf'])}"
        return
    for i, (before, after) in enumerate(zip(olds, new["allOf"], strict=True)):
        yield from _compare(pair, before, after, f"{at}/allOf/{i}")


Rule = Callable[[_Pair, Mapping[str, Any], Mapping[str, Any], str], Iterator[str]]
# The table: each rule reads its keywords of one (old, new) pair of schemas and says what narrowed.
RULES: tuple[Rule, ...] = (
    _type_rule,
    _enum_rule,
    _bounds_rule,
    _whole_rule,
    _required_rule,
    _properties_rule,
    _items_rule,
    _conditions_rule,
)

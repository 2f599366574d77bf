"""The BACKWARD compatibility table: each rule, and generated schema pairs against a validator."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from shared.contract.schema_compat import incompatibilities

INT = {"type": "integer", "minimum": 0, "maximum": 100}
TEXT = {"type": "string", "maxLength": 8}


def obj(required: tuple[str, ...] = (), closed: bool = True, **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


# (old, new, compatible): one row per rule, each way round.
TABLE = [
    (obj(a=INT), obj(("a",), a=INT), False),  # a new required property
    (obj(("a",), a=INT), obj(a=INT), True),  # no longer required
    (obj(a=INT, b=TEXT), obj(a=INT), False),  # removed from a closed object: b is refused
    (obj(a=INT, b=TEXT), {**obj(a=INT), "additionalProperties": True}, True),  # removed, open
    (obj(a=INT), obj(a=INT, b=TEXT), True),  # an optional property added to a closed object
    (obj(closed=False, a=INT), obj(a=INT, b=TEXT), False),  # closed: any other name was read
    (obj(closed=False, a=INT), obj(closed=False, a=INT, b=TEXT), False),  # b was any value
    ({"type": "integer"}, {"type": "number"}, True),
    ({"type": "number"}, {"type": "integer"}, False),
    ({"type": "string"}, {"type": ["string", "null"]}, True),
    ({"enum": ["a", "b"]}, {"enum": ["a"]}, False),
    ({"enum": ["a"]}, {"enum": ["a", "b"]}, True),
    ({"type": "string"}, {"type": "string", "enum": ["a"]}, False),
    (TEXT, {**TEXT, "maxLength": 4}, False),
    (TEXT, {**TEXT, "maxLength": 16}, True),
    ({"type": "string"}, TEXT, False),
    (INT, {**INT, "minimum": 1}, False),
    (INT, {**INT, "minimum": -1}, True),
    (INT, {**INT, "exclusiveMaximum": 100}, False),
    ({"type": "string"}, {"type": "string", "pattern": "^a"}, False),
    ({"type": "string", "pattern": "^a"}, {"type": "string"}, True),
    ({"const": 1}, {"const": 2}, False),
    ({"anyOf": [INT, {"type": "null"}]}, {"anyOf": [{**INT, "maximum": 50}, {"type": "null"}]}, False),
    ({"anyOf": [INT, {"type": "null"}]}, {"anyOf": [INT, TEXT, {"type": "null"}]}, True),
    (INT, {"anyOf": [INT, {"type": "null"}]}, True),
    ({"anyOf": [INT, {"type": "null"}]}, INT, False),
    ({"type": "array", "items": INT}, {"type": "array", "items": {**INT, "maximum": 5}}, False),
    ({"type": "array", "items": INT, "maxItems": 3}, {"type": "array", "items": INT}, True),
    (
        {"type": "object", "patternProperties": {"^x": INT}, "additionalProperties": False},
        {"type": "object", "patternProperties": {"^x": {**INT, "maximum": 9}}, "additionalProperties": False},
        False,
    ),
    (
        {"type": "object", "additionalProperties": INT},
        {"type": "object", "additionalProperties": INT, "propertyNames": {"maxLength": 3}},
        False,
    ),
    (
        {"$defs": {"A": obj(a=INT)}, "$ref": "#/$defs/A"},
        {"$defs": {"A": obj(("a",), a=INT)}, "$ref": "#/$defs/A"},
        False,
    ),
    (
        {"allOf": [{"if": {"required": ["k"]}, "then": obj(closed=False, k=INT)}]},
        {"allOf": [{"if": {"required": ["k"]}, "then": obj(closed=False, k={**INT, "maximum": 1})}]},
        False,
    ),
    ({}, {"allOf": [{"if": {"required": ["k"]}, "then": {}}]}, False),
    ({"title": "A", "description": "x", "default": 1}, {"title": "B"}, True),
    ({"type": "string"}, {"type": "string", "contentEncoding": "base64"}, False),  # unknown: changed
]


@pytest.mark.parametrize(("old", "new", "compatible"), TABLE)
def test_table(old: dict[str, Any], new: dict[str, Any], compatible: bool) -> None:
    found = incompatibilities(old, new)
    assert (found == []) is compatible, found


def test_a_recursive_schema_is_compared_once() -> None:
    tree = {"$defs": {"N": obj(kids={"type": "array", "items": {"$ref": "#/$defs/N"}})}, "$ref": "#/$defs/N"}
    assert incompatibilities(tree, tree) == []


def test_a_remote_ref_is_refused() -> None:
    with pytest.raises(ValueError, match="local"):
        incompatibilities({"$ref": "https://example.com/s.json"}, {})


# Schemas of the shapes this project writes (pydantic's): scalars with bounds, nullable by anyOf,
# arrays, objects open or closed with required fields.
NAMES = st.sampled_from(["a", "b", "c"])
VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 12) | st.sampled_from(["", "a", "ab", "abcdefghij", 1.5]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=8,
)


def _scalar() -> st.SearchStrategy[dict[str, Any]]:
    ints = st.builds(
        lambda lo, hi: {"type": "integer", **lo, **hi},
        st.sampled_from([{}, {"minimum": 0}, {"minimum": 2}]),
        st.sampled_from([{}, {"maximum": 5}, {"maximum": 10}, {"exclusiveMaximum": 10}]),
    )
    texts = st.builds(
        lambda n: {"type": "string", **n}, st.sampled_from([{}, {"maxLength": 1}, {"maxLength": 4}])
    )
    enums: st.SearchStrategy[dict[str, Any]] = st.sampled_from(
        [{"enum": ["a"]}, {"enum": ["a", "ab"]}, {"const": 1}, {"type": "number"}]
    )
    return ints | texts | enums


SCHEMAS: st.SearchStrategy[dict[str, Any]] = st.recursive(
    _scalar(),
    lambda inner: (
        st.builds(lambda s: {"anyOf": [s, {"type": "null"}]}, inner)
        | st.builds(
            lambda s, n: {"type": "array", "items": s, **n}, inner, st.sampled_from([{}, {"maxItems": 2}])
        )
        | st.builds(
            lambda props, req, closed: {
                "type": "object",
                "properties": props,
                "required": sorted(set(req) & set(props)),
                **({"additionalProperties": False} if closed else {}),
            },
            st.dictionaries(NAMES, inner, max_size=3),
            st.lists(NAMES, max_size=3),
            st.booleans(),
        )
    ),
    max_leaves=5,
)


@settings(max_examples=300, deadline=None)
@given(SCHEMAS)
def test_a_schema_reads_what_it_wrote(schema: dict[str, Any]) -> None:
    assert incompatibilities(schema, schema) == []


@settings(max_examples=400, deadline=None)
@given(SCHEMAS, SCHEMAS, st.lists(VALUES, min_size=1, max_size=20))
def test_compatible_means_every_old_value_is_read(
    old: dict[str, Any], new: dict[str, Any], values: list[Any]
) -> None:
    """Sound: when the table says compatible, no value the old schema accepts is refused by the new."""
    if incompatibilities(old, new):
        return
    before, after = Draft202012Validator(old), Draft202012Validator(new)
    for value in values:
        if before.is_valid(value):
            assert after.is_valid(value), (value, old, new)


@settings(max_examples=300, deadline=None)
@given(SCHEMAS, st.sampled_from(["a", "b", "c"]))
def test_requiring_a_new_field_is_always_seen(schema: dict[str, Any], name: str) -> None:
    """Issue 43's case, generated: an object whose optional field becomes required."""
    old = {"type": "object", "properties": {name: schema}, "required": []}
    new = {**old, "required": [name]}
    assert incompatibilities(old, new) == [f"#: newly required ['{name}']"]
    assert incompatibilities(new, old) == []

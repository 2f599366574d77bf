"""What every endpoint answers, as pydantic models, one module per resource (as services.api.routes).

The models are built from the rows `shared.store` returns, so each one names the
columns of its statement, in its order (the order the keys go out in). Every key
is always present: a value the database does not hold is `null`, never a missing
key, and an empty collection is `[]`. Times go out in the API's one format
(:func:`services.api.paging.z_time`: UTC, microseconds, `Z`). JSON the database
stores (evidence, reasons, details, records) is passed on as stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

from ..paging import z_time

ApiTime = Annotated[
    datetime,
    PlainSerializer(z_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-05-01T12:00:00.000000Z"]}),
]
# JSON as the database stores it (jsonb), passed on untouched.
StoredObject = dict[str, Any]
StoredList = list[dict[str, Any]]


class Answer(BaseModel):
    """An answer, or a part of one: every field always present (null where there is no value).

    Keys a row has beyond the model's fields are left out (a column a migration adds shows in
    the answer once a model names it; tests/integration/services/api/test_answers.py says when
    one is missing)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class Problem(Answer):
    """Every refusal: a 4xx (or a 503 while the database is unreachable) says why in `detail`."""

    detail: str


def problems(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` for the refusals in `described` (status -> when)."""
    return {status: {"model": Problem, "description": when} for status, when in described.items()}


# The cached answers' freshness (services.api.cache.Served.headers), declared on their 200.
FRESHNESS: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Age": {
                "description": "seconds since the answer was read from the database (RFC 9111)",
                "schema": {"type": "integer", "minimum": 0},
            },
            "Cache-Status": {
                "description": "what the API's cache did (RFC 9211): `hit` with a negative `ttl` is an answer"
                " served that many seconds after a newer scoring cycle was announced, while it is read again",
                "schema": {"type": "string"},
            },
        }
    }
}


# What every list shares, after its items: `total` counts all the filters match, `next_cursor` is null
# on the last page (services.api.paging).
Total = Annotated[int, Field(description="everything the filters match, not only this page")]
NextCursor = Annotated[
    str | None, Field(description="pass back as `cursor` for the next page; null: the last")
]


class Ready(Answer):
    ready: Literal[True]


class NotReady(Answer):
    ready: Literal[False]
    detail: str = Field(description="why the database cannot be reached")

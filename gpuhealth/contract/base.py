"""The contract's building blocks: the types every Kafka message of gpu-health is made of.

Times are UTC, cut to milliseconds and plausible (`UtcTime`, written by
wire_time); `schema_version` is required on the wire and stated by a producer
building a message in Python (`Version`); labels are bounded text; models are
strict (`StrictModel`). `parse_message` bounds a record's size and depth
(jsonlimits) before pydantic sees it and turns a refusal into a ContractError
that says why. The services' messages (shared/models*.py) and the training
alert (training.py) are built from these.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
)

from gpuhealth.errors import ContractError

from .jsonlimits import check_bounds
from .wire_time import wire_time

SCHEMA_VERSION = 1

_EPOCH_FLOOR = datetime(2000, 1, 1, tzinfo=UTC)
# Simulated fleets run ahead of the wall clock; anything further out is a broken clock.
_FUTURE_SLACK = timedelta(days=400)


_latest_allowed = (0.0, _EPOCH_FLOOR)  # (monotonic time computed, bound)


def _future_bound() -> datetime:
    """now + slack, recomputed at most once a second: this runs for every message."""
    global _latest_allowed
    computed, bound = _latest_allowed
    if (now := time.monotonic()) - computed > 1.0:
        bound = datetime.now(UTC) + _FUTURE_SLACK
        _latest_allowed = (now, bound)
    return bound


def sane_time(value: datetime) -> datetime:
    """A sample time as the contract stores it (UTC, ms), or ValueError if implausible."""
    if value.tzinfo is None:
        raise ValueError("time must carry a timezone (UTC)")
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    if value < _EPOCH_FLOOR or value > _future_bound():
        raise ValueError(f"time {value.isoformat()} is not a plausible sample time")
    if value.microsecond % 1000:
        value = value.replace(microsecond=value.microsecond // 1000 * 1000)  # the contract is ms
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # Literal[1] alone lets `true` through (True == 1)
        raise ValueError("schema_version must be the number 1")
    return value


class _Unstated(Enum):
    """The value of a schema_version a message did not state (an enum: it has a JSON form)."""

    UNSTATED = "unstated"


UNSTATED: Any = _Unstated.UNSTATED


def _stated(value: Any, info: ValidationInfo) -> Any:
    """On the wire (JSON) schema_version is required and never assumed: JSON without it is
    refused. A message built in Python (a producer's `GpuSample(...)`) gets the version this
    code writes. Strict validation takes no JSON-decoded dict (times must be datetimes
    there), so this is no back door for JSON."""
    if value is UNSTATED:
        if info.mode == "python":
            return SCHEMA_VERSION
        raise ValueError("schema_version is required")
    return value


def version_required(schema: dict[str, Any]) -> None:
    """The JSON Schema of a top-level message: schema_version required, with no default."""
    schema["properties"]["schema_version"].pop("default", None)
    schema["required"] = ["schema_version", *(r for r in schema.get("required", ()) if r != "schema_version")]


_WIRE_TIME = PlainSerializer(wire_time, return_type=str, when_used="json")  # the topics' time format
UtcTime = Annotated[datetime, AfterValidator(sane_time), _WIRE_TIME]
# validators run last-first: the unstated check, then the type's own
Version = Annotated[
    Literal[1], BeforeValidator(_not_bool), BeforeValidator(_stated), Field(validate_default=True)
]
Label = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f]*$")]
GPU_UUID_PATTERN = r"^(GPU|MIG)-[A-Za-z0-9/-]{8,96}$"  # the one definition (the API's parameters use it)
GpuUuid = Annotated[str, Field(pattern=GPU_UUID_PATTERN)]
Pct = Annotated[float | None, Field(ge=0, le=100)]  # a percentage the source may not report


class StrictModel(BaseModel):
    """A message or a part of one: JSON types exactly, no unknown field, no NaN, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class TopicMessage(StrictModel):
    """A topic's message: `schema_version` first, required on the wire and in its JSON Schema,
    stated by a producer building it in Python. A subclass's own `json_schema_extra` must call
    `version_required` too."""

    model_config = ConfigDict(json_schema_extra=version_required)

    schema_version: Version = UNSTATED


def error_reason(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "message"
    more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _check_version(raw: bytes | str) -> None:
    """A clear 'unknown schema version' before field errors that would only confuse."""
    try:
        head = json.loads(raw)  # bounded in depth by check_bounds, but never let it decide anything
    except (ValueError, RecursionError):
        return  # the model's own parser reports malformed JSON
    if isinstance(head, dict) and "schema_version" not in head:
        raise ContractError("schema_version is required")
    if isinstance(head, dict) and head.get("schema_version") != SCHEMA_VERSION:
        raise ContractError(f"unknown schema_version {head.get('schema_version')!r}")


M = TypeVar("M", bound=BaseModel)


def parse_message(model: type[M], raw: bytes | str) -> M:
    """`raw` as `model`, bounds checked first; ContractError says why it is refused."""
    check_bounds(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        _check_version(raw)
        raise ContractError(error_reason(e)) from e


def to_json(model: BaseModel) -> dict[str, Any]:
    """The message value: JSON-ready, nulls kept so consumers see every field."""
    return model.model_dump(mode="json")

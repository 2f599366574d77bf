"""The contract of `gpu-dead-letters`: `DeadLetterHeaders`, what a dead letter says of the record it carries.

A dead letter's value is the refused record's own bytes (cut to MAX_DLQ_VALUE,
with a header saying so) and its key the record's key: neither has a shape of
the project's, since the record was refused for not having one. What the
contract fixes is the headers, each UTF-8 text: the consumer group that
refused it, the source topic, partition and offset, the category (a small
fixed set, the sink's metric label), the error, when it failed (written by
gpuhealth.contract.wire_time like every topic's times), and the headers' schema version.
The committed JSON Schema describes the headers as one object keyed by header
name. Parsing is strict like every topic's: unknown or repeated headers,
missing ones, non-numbers where numbers go, NUL and lone surrogates are refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError

from gpuhealth.contract.base import UNSTATED, StrictModel, UtcTime, Version, error_reason
from shared.plumbing.errors import ContractError

_NUMBERS = ("dlq.schema_version", "dlq.source.partition", "dlq.source.offset", "dlq.value_truncated_from")


def _version_required(schema: dict[str, Any]) -> None:
    """As every topic's schema: its version required, with no default (here under its header name)."""
    schema["properties"]["dlq.schema_version"].pop("default", None)
    schema["required"] = ["dlq.schema_version", *(r for r in schema["required"] if r != "dlq.schema_version")]


class DeadLetterHeaders(StrictModel):
    """The headers of one gpu-dead-letters message (built by field name, on the wire by header name)."""

    model_config = ConfigDict(json_schema_extra=_version_required, populate_by_name=True)

    schema_version: Version = Field(UNSTATED, alias="dlq.schema_version")
    consumer_group: Annotated[str, Field(max_length=255, pattern=r"^[^\x00-\x1f\x7f]*$")] = Field(
        alias="dlq.consumer_group"
    )
    source_topic: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")] = Field(alias="dlq.source.topic")
    source_partition: int = Field(ge=0, lt=2**31, alias="dlq.source.partition")
    source_offset: int = Field(ge=0, lt=2**63, alias="dlq.source.offset")
    category: Annotated[str, Field(pattern=r"^[a-z_]{1,64}$")] = Field(alias="dlq.category")
    error: Annotated[str, Field(max_length=4000, pattern=r"^[^\x00]*$")] = Field(alias="dlq.error")
    failed_at: UtcTime = Field(alias="dlq.failed_at")
    # the size of the refused record, where the value was cut to fit the topic
    value_truncated_from: int | None = Field(default=None, ge=0, lt=2**63, alias="dlq.value_truncated_from")


def dead_letter_headers(headers: DeadLetterHeaders) -> list[tuple[str, str | bytes | None]]:
    """The Kafka headers a producer sends: UTF-8 text each, in field order; an absent value leaves its out."""
    wire = headers.model_dump(mode="json", by_alias=True, exclude_none=True)
    return [(name, str(value).encode()) for name, value in wire.items()]


def parse_dead_letter_headers(raw: Sequence[tuple[str, bytes | None]] | None) -> DeadLetterHeaders:
    """Validate the headers of one gpu-dead-letters message; ContractError says why they are refused."""
    fields: dict[str, Any] = {}
    for name, value in raw or ():
        if name in fields:
            raise ContractError(f"{name}: header repeated")
        if value is None:
            raise ContractError(f"{name}: header has no value")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ContractError(f"{name}: header is not UTF-8") from e
        fields[name] = _number(name, text) if name in _NUMBERS else text
    if "dlq.schema_version" not in fields:
        raise ContractError("dlq.schema_version is required")
    try:  # as JSON, so the contract's strict JSON rules apply (a time is text there)
        return DeadLetterHeaders.model_validate_json(json.dumps(fields))
    except ValidationError as e:
        raise ContractError(error_reason(e)) from e


def _number(name: str, text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise ContractError(f"{name}: header is not a whole number")
    return int(text)

"""Messages as rows for binary COPY, in the column layout shared.store.samples and .events derive
from the contract models (so the two cannot drift apart).

`gpu_metrics` holds every sample field but the identity columns that live in
`gpu_assets` (model, index, PCI bus, driver); the staging row carries those
too, so one COPY feeds gpu_metrics, gpu_latest and gpu_assets. It also ends
with the message's schema_version: the staging row is then the decoded
message itself, in field order, without being copied into a narrower tuple.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from psycopg.types.json import Jsonb

from shared.contract.fastdecode import FastDecoder, as_builtins
from shared.contract.models import METRIC_FIELDS, GpuSample, sane_time
from shared.contract.topic_registry import TopicSettings
from shared.store.events import EVENT_COLUMNS, EVENT_TYPES, event_row
from shared.store.samples import (
    ASSET_ONLY,
    GPU_UUID,
    METRIC_COLUMNS,
    PLAIN_COLUMNS,
    STAGE_COLUMNS,
    STAGE_TYPES,
    TIME,
)

# The column layout is the store's; it is named here too for the sink's callers.
__all__ = [
    "EVENT_COLUMNS",
    "EVENT_TYPES",
    "GPU_UUID",
    "METRIC_COLUMNS",
    "STAGE_COLUMNS",
    "STAGE_TYPES",
    "TIME",
    "Row",
    "event_row",
    "newest_per_gpu",
    "sample_row",
    "stage_row",
    "stage_rows",
]

_plain = attrgetter(*PLAIN_COLUMNS)
_metrics = attrgetter(*METRIC_FIELDS)
_assets = attrgetter(*ASSET_ONLY)


Row = tuple[Any, ...]


def _mig_column(instances: list[dict[str, Any]]) -> Jsonb | None:
    """MIG instances as JSON, and none ([]) as NULL."""
    return Jsonb(instances) if instances else None


def sample_row(s: GpuSample) -> Row:
    mig = _mig_column([m.model_dump() for m in s.mig])
    return (*_plain(s), mig, *_metrics(s), *_assets(s), s.schema_version)


def _stage_mig(message: Any) -> None:
    """The fast decoder's MIG field in its column form, as msgspec builds the message."""
    if (mig := message.mig) is not None:
        message.mig = _mig_column(as_builtins(mig))


# The contract's JSON Schema compiled into a decoder that yields staging rows.
METRICS_RAW = TopicSettings.entry("metrics_raw")
FAST_SAMPLE = FastDecoder(GpuSample.model_json_schema(), STAGE_COLUMNS, sane_time, _stage_mig)


def stage_row(raw: bytes | str) -> Row:
    """One gpu-metrics-raw message as a staging row; ContractError says why it is refused.

    The msgspec decoder compiled from the contract's JSON Schema takes the common case;
    whatever it declines, the pydantic model decides (and names the reason when it refuses).
    """
    row = FAST_SAMPLE.decode(raw)
    return row if row is not None else sample_row(METRICS_RAW.read(GpuSample, raw))


def stage_rows(raws: Sequence[bytes]) -> list[Row] | None:
    """Every message as a staging row by the msgspec decoder alone, or None if it declines any
    one of them (then each is taken on its own by stage_row, which names the reason)."""
    return FAST_SAMPLE.decode_many(raws)


def newest_per_gpu(rows: Iterable[Row]) -> list[Row]:
    """Each GPU's newest row (the first of equals), with the time of its oldest row appended
    (first_seen)."""
    newest: dict[str, Row] = {}
    first: dict[str, datetime] = {}
    for row in rows:
        gpu, time = row[GPU_UUID], row[TIME]
        kept = newest.get(gpu)
        if kept is None:
            newest[gpu], first[gpu] = row, time
        elif time > kept[TIME]:
            newest[gpu] = row
        elif time < first[gpu]:
            first[gpu] = time
    return [(*row, first[gpu]) for gpu, row in newest.items()]

"""Rows for binary COPY, laid out from the contract models so the two cannot drift apart.

`gpu_metrics` holds every sample field but the identity columns that live in
`gpu_assets` (model, index, PCI bus, driver); the staging table carries those
too, so one COPY feeds gpu_metrics, gpu_latest and gpu_assets.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from psycopg.types.json import Jsonb

from shared.models import METRIC_FIELDS, GpuEvent, GpuSample

ASSET_ONLY = ("model", "gpu_index", "pci_bus_id", "driver_version")
_PLAIN = (
    "time", "gpu_uuid", "hostname", "cluster", "datacenter", "region", "rack", "job", "pod",
    "namespace", "container", "source", "collector_id", "collection_latency_ms",
)  # fmt: skip
METRIC_COLUMNS: tuple[str, ...] = (*_PLAIN, "mig", *METRIC_FIELDS)
STAGE_COLUMNS: tuple[str, ...] = (*METRIC_COLUMNS, *ASSET_ONLY)


def _pg_type(field: str) -> str:
    annotation = str(GpuSample.model_fields[field].annotation)
    return "double precision" if "float" in annotation else "bigint"


_TEXT = "text"
STAGE_TYPES: tuple[str, ...] = (
    "timestamptz", *([_TEXT] * 12), "double precision", "jsonb",
    *(_pg_type(f) for f in METRIC_FIELDS),
    _TEXT, "smallint", _TEXT, _TEXT,
)  # fmt: skip

_plain = attrgetter(*_PLAIN)
_metrics = attrgetter(*METRIC_FIELDS)
_assets = attrgetter(*ASSET_ONLY)


def sample_row(s: GpuSample) -> tuple[Any, ...]:
    mig = Jsonb([m.model_dump() for m in s.mig]) if s.mig else None
    return (*_plain(s), mig, *_metrics(s), *_assets(s))


EVENT_COLUMNS: tuple[str, ...] = (
    "time", "gpu_uuid", "kind", "hostname", "cluster", "datacenter", "rack", "source",
    "collector_id", "details",
)  # fmt: skip
EVENT_TYPES: tuple[str, ...] = ("timestamptz", *([_TEXT] * 8), "jsonb")
_event_plain = attrgetter(*EVENT_COLUMNS[:-1])


def event_row(e: GpuEvent) -> tuple[Any, ...]:
    return (*_event_plain(e), Jsonb(e.details))

"""Reads a dcgm-exporter (or the mock) over HTTP and parses its Prometheus exposition.

Parsing uses prometheus_client's text parser, so anything the format allows is
understood: labels in any order, extra labels, escaped values, timestamps.
Both `Hostname` and `hostname` name the host; older DCGM field names map to
the current ones (shared.dcgm); DCGM's blank sentinels become None; MIG
series (GPU_I_PROFILE/GPU_I_ID labels) are kept per instance under `mig`.
A sample timestamp in the exposition (the mock's accelerated clock) is the
reading's time; without one, the scrape time is.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from shared.dcgm import BY_NAME, ValueKind, is_blank
from shared.models import MigInstance, Source

from .readings import GpuReading, MetricValue, SourceError, SourceReading

_WORKLOAD_LABELS = {"pod": "pod", "namespace": "namespace", "container": "container",
                    "hpc_job": "job", "job": "job", "jobid": "job"}  # fmt: skip
_MIG_FIELDS = frozenset(MigInstance.model_fields) - {"profile", "instance_id"}
MAX_BODY_BYTES = 32 * 1024 * 1024


def _value(raw: float, kind: ValueKind) -> MetricValue:
    if is_blank(raw, kind):
        return None
    return int(raw) if kind is ValueKind.INT64 else float(raw)


def parse_exposition(text: str, *, scraped_at: datetime) -> list[GpuReading]:
    """Every GPU in a dcgm-exporter page; unknown metrics are ignored."""
    gpus: dict[str, GpuReading] = {}
    mig: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SourceError(f"exposition does not parse: {e}") from e
    for family in families:
        for sample in family.samples:
            field = BY_NAME.get(sample.name) or BY_NAME.get(family.name)
            labels = sample.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            if field is None or not uuid:
                continue
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _new_reading(uuid, labels, sample.timestamp, scraped_at)
            value = _value(sample.value, field.kind)
            instance = labels.get("GPU_I_ID")
            if instance:
                entry = mig.setdefault(
                    (uuid, instance),
                    {
                        "profile": labels.get("GPU_I_PROFILE") or "unknown",
                        "instance_id": int(instance),
                    },
                )
                if field.sample_field in _MIG_FIELDS:
                    entry[field.sample_field] = value
                continue
            gpu.metrics[field.sample_field] = value
    for (uuid, _), entry in sorted(mig.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        gpus[uuid].mig.append(entry)
    return sorted(gpus.values(), key=lambda g: g.index)


def _new_reading(uuid: str, labels: dict[str, str], timestamp: Any, scraped_at: datetime) -> GpuReading:
    try:
        index = int(labels.get("gpu", "0"))
    except ValueError:
        index = 0
    when = scraped_at
    if timestamp is not None:
        when = datetime.fromtimestamp(float(timestamp), UTC)
    return GpuReading(
        uuid=uuid,
        index=index,
        model=labels.get("modelName") or "unknown",
        pci_bus_id=labels.get("pci_bus_id") or None,
        driver_version=labels.get("DCGM_FI_DRIVER_VERSION") or None,
        hostname=labels.get("Hostname") or labels.get("hostname") or None,
        time=when,
        workload={ours: labels[theirs] for theirs, ours in _WORKLOAD_LABELS.items() if labels.get(theirs)},
    )


class DcgmSource:
    """One dcgm-exporter endpoint (one node)."""

    def __init__(
        self, url: str, *, kind: Source = Source.DCGM, timeout_s: float = 5.0,
        client: httpx.Client | None = None,
    ) -> None:  # fmt: skip
        self.kind, self.target = kind, url
        self._client = client or httpx.Client(timeout=timeout_s)

    def read(self) -> SourceReading:
        started = time.perf_counter()
        scraped_at = datetime.now(UTC)
        try:
            response = self._client.get(self.target)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise SourceError(f"scrape of {self.target} failed: {e}") from e
        if len(response.content) > MAX_BODY_BYTES:
            raise SourceError(f"{self.target} answered {len(response.content)} bytes; too large")
        gpus = parse_exposition(response.text, scraped_at=scraped_at)
        return SourceReading(
            source=self.kind,
            target=self.target,
            gpus=gpus,
            read_at=scraped_at,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        self._client.close()

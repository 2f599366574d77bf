"""Reads a dcgm-exporter (or the mock) over HTTP and parses its Prometheus exposition.

Parsing uses prometheus_client's text parser, so anything the format allows is
understood: labels in any order, extra labels, escaped values, timestamps.
Both `Hostname` and `hostname` name the host; older DCGM field names map to
the current ones (shared.gpu.dcgm); DCGM's blank sentinels become None; MIG
series (GPU_I_PROFILE/GPU_I_ID labels) are kept per instance under `mig`.
A sample timestamp in the exposition (the mock's accelerated clock) is the
reading's time; without one, the scrape time is.

XIDs: `DCGM_FI_DEV_XID_ERRORS` holds only the latest code, so two XIDs between
scrapes (a 48 with a 94) would show as one. Where the exporter also offers
`DCGM_EXP_XID_ERRORS_COUNT{xid="..."}` (a count per code over its window),
each rise of a count since the previous scrape is that many XIDs of that
code, listed in the reading; a GPU's first scrape only sets the counts. A
count that falls (its window moved on) or disappears rises again from there.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.gpu.readings import GpuReading, MetricValue, SourceError, SourceReading
from shared.contract.models import MigInstance, Source
from shared.gpu.dcgm import BY_NAME, XID_COUNT_METRIC, ValueKind, is_blank

_WORKLOAD_LABELS = {
    "pod": "pod",
    "namespace": "namespace",
    "container": "container",
    "hpc_job": "job",
    "job": "job",
    "jobid": "job",
}
_MIG_FIELDS = frozenset(MigInstance.model_fields) - {"profile", "instance_id"}
MAX_BODY_BYTES = 32 * 1024 * 1024
_XID_CODE = re.compile(r"[0-9]{1,6}")  # ASCII digits: str.isdigit() also takes '²'
MAX_XIDS_PER_SCRAPE = 1000  # per GPU: a count that jumps by billions is not a billion events


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
    counted = any(f.name == XID_COUNT_METRIC for f in families)
    for family in families:
        for sample in family.samples:
            field = BY_NAME.get(sample.name) or BY_NAME.get(family.name)
            labels = sample.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            if not uuid or (field is None and family.name != XID_COUNT_METRIC):
                continue
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _new_reading(uuid, labels, sample.timestamp, scraped_at)
            if field is None:
                _count_xid(gpu, labels.get("xid", ""), sample.value)
                continue
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
    if counted:
        for gpu in gpus.values():
            if gpu.xid_counts is None:
                gpu.xid_counts = {}
    return sorted(gpus.values(), key=lambda g: g.index)


def _count_xid(gpu: GpuReading, code_text: str, value: float) -> None:
    """One DCGM_EXP_XID_ERRORS_COUNT series: how many XIDs of one code the exporter counted."""
    counts = gpu.xid_counts if gpu.xid_counts is not None else {}
    gpu.xid_counts = counts
    if not _XID_CODE.fullmatch(code_text) or is_blank(value, ValueKind.INT64) or not 0 <= value < 2**53:
        return
    code = int(code_text)
    if 0 < code <= 100_000:
        counts[code] = counts.get(code, 0) + int(value)


def new_xids(before: dict[int, int] | None, now: dict[int, int]) -> list[int]:
    """The XIDs behind the counts' rises since the previous scrape (none on the first one)."""
    if before is None:
        return []
    xids: list[int] = []
    for code in sorted(now):
        rise = now[code] - before.get(code, 0)
        xids += [code] * max(0, min(rise, MAX_XIDS_PER_SCRAPE - len(xids)))
    return xids


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
        self,
        url: str,
        *,
        kind: Source = Source.DCGM,
        timeout_s: float = 5.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.kind, self.target = kind, url
        self._client = client or httpx.Client(timeout=timeout_s)
        self._xid_counts: dict[str, dict[int, int]] = {}  # GPU UUID -> counts at the last scrape

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
        for gpu in gpus:
            if gpu.xid_counts is not None:
                gpu.xids = new_xids(self._xid_counts.get(gpu.uuid), gpu.xid_counts)
                self._xid_counts[gpu.uuid] = gpu.xid_counts
        return SourceReading(
            source=self.kind,
            target=self.target,
            gpus=gpus,
            read_at=scraped_at,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        self._client.close()

"""Turns a source's readings into contract samples, adding placement and workload.

Placement comes from configuration (this node's cluster, datacenter, region,
rack) and, per hostname, from an inventory CSV whose header names its columns:
``hostname,rack,datacenter,cluster,region`` (any subset after hostname). The
inventory wins over configuration, because it is specific to the host.

A reading that breaks the contract in one metric (a negative temperature, a
counter beyond int64) loses that metric, which becomes null and is counted,
not the whole sample: the other forty readings of that GPU are still good.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuhealth.gpu.readings import GpuReading, SourceReading
from shared.contract.models import METRIC_FIELDS, GpuSample, MigInstance
from shared.plumbing.errors import ConfigError

log = logging.getLogger(__name__)

_PLACEMENT_COLUMNS = ("rack", "datacenter", "cluster", "region")
# Counters and flags are integers in the contract; sources may hand them over as floats.
_INTEGER_FIELDS = frozenset(
    name
    for name in METRIC_FIELDS
    if "int" in str(GpuSample.model_fields[name].annotation)
    and "float" not in str(GpuSample.model_fields[name].annotation)
)


def _as_contract_type(name: str, value: Any) -> Any:
    if name in _INTEGER_FIELDS and isinstance(value, float) and math.isfinite(value):
        return int(value)
    return value


@dataclass(frozen=True, slots=True)
class Placement:
    cluster: str | None = None
    datacenter: str | None = None
    region: str | None = None
    rack: str | None = None


def load_inventory(path: Path) -> dict[str, Placement]:
    """hostname -> placement, from a CSV file; malformed files are a ConfigError."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames or "hostname" not in reader.fieldnames:
                raise ConfigError(f"inventory {path}: the header must include 'hostname'")
            unknown = set(reader.fieldnames) - {"hostname", *_PLACEMENT_COLUMNS}
            if unknown:
                raise ConfigError(f"inventory {path}: unknown columns {sorted(unknown)}")
            inventory: dict[str, Placement] = {}
            for line, row in enumerate(reader, start=2):
                host = (row.get("hostname") or "").strip()
                if not host:
                    raise ConfigError(f"inventory {path}:{line}: empty hostname")
                if host in inventory:
                    raise ConfigError(f"inventory {path}:{line}: {host} is listed twice")
                inventory[host] = Placement(
                    **{c: (row.get(c) or "").strip() or None for c in _PLACEMENT_COLUMNS}
                )
    except OSError as e:
        raise ConfigError(f"inventory {path}: {e}") from e
    except csv.Error as e:
        raise ConfigError(f"inventory {path}: not a CSV file: {e}") from e
    return inventory


class Enricher:
    """Builds GpuSample messages; counts (through `on_invalid`) metrics dropped as invalid."""

    def __init__(
        self,
        *,
        collector_id: str,
        local_hostname: str,
        placement: Placement,
        inventory: dict[str, Placement] | None = None,
        on_invalid: Callable[[str], None] = lambda field: None,
    ) -> None:
        self.collector_id = collector_id
        self.local_hostname = local_hostname
        self.placement = placement
        self.inventory = inventory or {}
        self.on_invalid = on_invalid

    def placement_for(self, hostname: str) -> Placement:
        specific = self.inventory.get(hostname)
        if specific is None:
            return self.placement
        return replace(
            self.placement,
            **{k: v for k in _PLACEMENT_COLUMNS if (v := getattr(specific, k)) is not None},
        )

    def sample(self, gpu: GpuReading, reading: SourceReading) -> GpuSample | None:
        """The contract sample for one GPU, or None when its identity itself is invalid."""
        hostname = gpu.hostname or self.local_hostname
        where = self.placement_for(hostname)
        fields: dict[str, Any] = {
            "time": gpu.time or reading.read_at,
            "source": reading.source,
            "collector_id": self.collector_id,
            "collection_latency_ms": round(reading.latency_ms, 3),
            "gpu_uuid": gpu.uuid,
            "gpu_index": gpu.index,
            "model": gpu.model,
            "pci_bus_id": gpu.pci_bus_id,
            "driver_version": gpu.driver_version,
            "hostname": hostname,
            "cluster": where.cluster,
            "datacenter": where.datacenter,
            "region": where.region,
            "rack": where.rack,
            **{k: v for k, v in gpu.workload.items() if k in ("job", "pod", "namespace", "container")},
            **{k: _as_contract_type(k, v) for k, v in gpu.metrics.items() if k in METRIC_FIELDS},
        }
        mig = [m for m in (self._mig(entry) for entry in gpu.mig) if m is not None]
        return self._validate(fields, mig)

    def _mig(self, entry: dict[str, object]) -> MigInstance | None:
        try:
            return MigInstance.model_validate(entry, strict=False)
        except ValidationError:
            self.on_invalid("mig")
            return None

    def _validate(self, fields: dict[str, Any], mig: list[MigInstance]) -> GpuSample | None:
        # Two rounds at most: the first finds every bad metric at once.
        for _ in range(2):
            try:
                return GpuSample(**fields, mig=mig)
            except ValidationError as e:
                bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
                if not bad or not bad <= set(METRIC_FIELDS):
                    log.warning(
                        "dropping a reading with an invalid identity",
                        extra={"gpu_uuid": fields.get("gpu_uuid"), "error": str(e)},
                    )
                    self.on_invalid("identity")
                    return None
                for name in sorted(bad):
                    log.warning(
                        "invalid %s from %s: %r",
                        name,
                        fields["gpu_uuid"],
                        fields[name],
                        extra={"field": name},
                    )
                    self.on_invalid(name)
                    fields[name] = None
        return None


def reading_time(reading: SourceReading) -> datetime:
    """The time a poll's events are stamped with: the newest reading's own clock."""
    times = [g.time for g in reading.gpus if g.time is not None]
    return max(times) if times else reading.read_at

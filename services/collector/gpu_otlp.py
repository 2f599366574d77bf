"""The GPU readings as OpenTelemetry instruments: the latest sample of each GPU, observed at export.

Every metric field of the DCGM catalogue (shared.gpu.dcgm) is one instrument
named ``gpuhealth.gpu.<sample field>``: DCGM counters are observable
counters (cumulative, monotonic), everything else observable gauges. Each
point carries the GPU's identity and placement as attributes (``gpu.uuid``,
``gpu.index``, ``gpu.model``, ``gpu.pci_bus_id``, ``gpu.driver_version``,
``host.name``, ``cluster``, ``datacenter``, ``region``, ``rack``, the
workload's ``job``, ``k8s.pod.name``, ``k8s.namespace.name``,
``k8s.container.name``, and ``gpu.source``). A GPU that has not reported for
`stale_after_s` stops being exported rather than repeating its last value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from shared.contract.models import GpuSample
from shared.gpu.dcgm import FIELDS, PromType

# The unit of a field, from the suffix its name carries (UCUM, as OTLP expects).
_UNITS = (
    ("_bytes_per_s", "By/s"),
    ("_mhz", "MHz"),
    ("_temp_c", "Cel"),
    ("_w", "W"),
    ("_mj", "mJ"),
    ("_pct", "%"),
    ("_ratio", "1"),
    ("_mib", "MiBy"),
    ("_us", "us"),
)
_PLACEMENT = (
    ("hostname", "host.name"),
    ("cluster", "cluster"),
    ("datacenter", "datacenter"),
    ("region", "region"),
    ("rack", "rack"),
    ("job", "job"),
    ("pod", "k8s.pod.name"),
    ("namespace", "k8s.namespace.name"),
    ("container", "k8s.container.name"),
    ("pci_bus_id", "gpu.pci_bus_id"),
    ("driver_version", "gpu.driver_version"),
)
PREFIX = "gpuhealth.gpu."


def unit_of(field: str) -> str:
    """The UCUM unit of a sample field, from its suffix; counts and flags are '1'."""
    return next((unit for suffix, unit in _UNITS if field.endswith(suffix)), "1")


def gpu_attributes(sample: GpuSample) -> dict[str, str | int]:
    """The GPU's identity and placement, as point attributes (unset values left out)."""
    attrs: dict[str, str | int] = {
        "gpu.uuid": sample.gpu_uuid,
        "gpu.index": sample.gpu_index,
        "gpu.model": sample.model,
        "gpu.source": sample.source.value,
    }
    for field, name in _PLACEMENT:
        value = getattr(sample, field)
        if value is not None:
            attrs[name] = value
    return attrs


class GpuInstruments:
    """Holds each GPU's latest sample; the SDK reads it through one callback per field."""

    def __init__(
        self, meter: Meter, *, stale_after_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._latest: dict[str, tuple[float, dict[str, Any], GpuSample]] = {}
        self._lock = threading.Lock()
        self._stale_after_s, self._clock = stale_after_s, clock
        for field in FIELDS:
            create = (
                meter.create_observable_counter
                if field.prom_type is PromType.COUNTER
                else meter.create_observable_gauge
            )
            create(
                PREFIX + field.sample_field,
                callbacks=[self._callback(field.sample_field)],
                unit=unit_of(field.sample_field),
                description=field.help,
            )

    def observe(self, samples: Iterable[GpuSample]) -> None:
        """Remember the newest sample of each GPU (called by the poll loop after each read)."""
        now = self._clock()
        with self._lock:
            for sample in samples:
                self._latest[sample.gpu_uuid] = (now, gpu_attributes(sample), sample)

    def _current(self) -> list[tuple[dict[str, Any], GpuSample]]:
        horizon = self._clock() - self._stale_after_s
        with self._lock:
            for uuid in [u for u, (seen, _, _) in self._latest.items() if seen < horizon]:
                del self._latest[uuid]
            return [(attrs, sample) for _, attrs, sample in self._latest.values()]

    def _callback(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(value, attrs)
                for attrs, sample in self._current()
                if (value := getattr(sample, field)) is not None
            ]

        return observe

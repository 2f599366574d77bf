"""OTLP metric export for every long-running service, off unless configured, set up in one place.

`shared.plumbing.service.start_service` calls :func:`start_export` and
`serve_metrics` hands it the service's Prometheus registry, so a service gets
OTLP by serving /metrics; the collector also asks :func:`meter` for its GPU
gauges. The export is on when ``GPUHEALTH_OTLP__ENABLED=true``, or when an
OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``) and the switch is not ``false``;
``OTEL_SDK_DISABLED=true`` or ``OTEL_METRICS_EXPORTER=none`` turn it off
whatever else is set. Everything else is the standard variables, read by the
OpenTelemetry exporters themselves: endpoint, headers, TLS, compression,
timeout; the protocol (``grpc`` or ``http/protobuf``, the default per the
specification) from ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` or
``OTEL_EXPORTER_OTLP_PROTOCOL``; the period from ``OTEL_METRIC_EXPORT_INTERVAL``
(ms, 60000) and ``OTEL_METRIC_EXPORT_TIMEOUT`` (ms, 30000); extra resource
attributes from ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``, which
win over the defaults (``service.name`` = ``gpuhealth-<service>``,
``service.version``, ``host.name``, ``service.namespace``,
``service.instance.id``). :func:`shutdown` exports once more before it
returns, so what happened up to SIGTERM is not lost.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

from shared.plumbing.errors import ConfigError
from shared.plumbing.otlp_prometheus import registry_metrics
from shared.settings.common import Section, Settings

log = logging.getLogger(__name__)

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
PROMETHEUS_SCOPE = InstrumentationScope("gpuhealth.prometheus")
FLUSH_TIMEOUT_S = 5.0  # the last export on SIGTERM waits at most this long


class OtlpSection(Section):
    """GPUHEALTH_OTLP__*: the explicit switch and protocol; everything else is OTEL_*."""

    enabled: bool | None = None
    """Export metrics over OTLP; unset: on when `OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT` is set."""
    protocol: Protocol | None = None
    """`grpc` or `http/protobuf`; unset: `OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL`, else `http/protobuf`."""


class OtlpSettings(Settings):
    """Only the OTLP section, read beside each service's own settings by start_service."""

    otlp: OtlpSection = OtlpSection()


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """What the export does once it is on."""

    protocol: Protocol
    interval_s: float
    timeout_s: float


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _millis(env: Mapping[str, str], name: str, default: float) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default / 1000
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of milliseconds") from None
    if not 0 < value < 86_400_000:
        raise ConfigError(f"{name}={raw!r} must be between 0 and a day, in milliseconds")
    return value / 1000


def otlp_target(section: OtlpSection, env: Mapping[str, str]) -> OtlpTarget | None:
    """Whether and how to export, from the switch and the standard variables; ConfigError if invalid."""
    if _flag(env.get("OTEL_SDK_DISABLED")):
        return None
    if (env.get("OTEL_METRICS_EXPORTER") or "").strip().lower() == "none":
        return None
    enabled = section.enabled
    if enabled is None:
        enabled = any((env.get(name) or "").strip() for name in ENDPOINT_VARS)
    if not enabled:
        return None
    protocol = section.protocol or (
        (env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "")
        .strip()
        .lower()
        or "http/protobuf"
    )
    if protocol not in PROTOCOLS:
        raise ConfigError(f"OTLP protocol {protocol!r} is not supported; use one of {', '.join(PROTOCOLS)}")
    return OtlpTarget(
        protocol=protocol,
        interval_s=_millis(env, "OTEL_METRIC_EXPORT_INTERVAL", 60_000),
        timeout_s=_millis(env, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000),
    )


def project_version() -> str:
    """The installed distribution's version, else pyproject.toml's (the checkout runs uninstalled)."""
    try:
        return metadata.version("gpu-health")
    except metadata.PackageNotFoundError:
        pass
    try:
        with (Path(__file__).resolve().parents[2] / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"


def service_resource(service: str) -> Resource:
    """The resource every point of this process carries; OTEL_RESOURCE_ATTRIBUTES/OTEL_SERVICE_NAME win."""
    host = socket.gethostname()
    ours = Resource.create(
        {
            "service.name": f"gpuhealth-{service}",
            "service.namespace": "gpu-health",
            "service.version": project_version(),
            "service.instance.id": f"{host}:{os.getpid()}",
            "host.name": host,
        }
    )
    return ours.merge(OTELResourceDetector().detect())


def make_exporter(protocol: Protocol) -> MetricExporter:
    """The SDK's OTLP exporter for `protocol`; it reads OTEL_EXPORTER_OTLP_* itself."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    return Http()


class OtlpExport:
    """One process's export: instruments from its meters plus its Prometheus registries, every interval."""

    def __init__(
        self, *, resource: Resource, exporter: MetricExporter, interval_s: float, timeout_s: float
    ) -> None:
        self.resource, self.exporter = resource, exporter
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._reader = InMemoryMetricReader()
        self._provider = MeterProvider(
            resource=resource, metric_readers=[self._reader], shutdown_on_exit=False
        )
        self._registries: list[CollectorRegistry] = []
        self._start_ns = time.time_ns()
        self._export_lock = threading.Lock()  # exporters must not be called concurrently
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._closed = False
        self._last_failure_log = 0.0
        self.exports = {"ok": 0, "failed": 0}

    def start(self) -> None:
        self._thread.start()

    def add_registry(self, registry: CollectorRegistry) -> None:
        if registry not in self._registries:
            self._registries.append(registry)

    def meter(self, name: str) -> Meter:
        return self._provider.get_meter(name)

    def collect(self) -> MetricsData:
        """Everything this process exports, as of now."""
        scopes: list[ScopeMetrics] = []
        instruments = self._reader.get_metrics_data()
        if instruments is not None:
            for resource_metrics in instruments.resource_metrics:
                scopes.extend(resource_metrics.scope_metrics)
        now = time.time_ns()
        bridged = [
            m for r in self._registries for m in registry_metrics(r, start_ns=self._start_ns, now_ns=now)
        ]
        if bridged:
            scopes.append(ScopeMetrics(scope=PROMETHEUS_SCOPE, metrics=bridged, schema_url=""))
        return MetricsData([ResourceMetrics(resource=self.resource, scope_metrics=scopes, schema_url="")])

    def export_once(self, timeout_s: float | None = None) -> bool:
        """Collect and export now; False (logged, at most once a minute) when the receiver failed."""
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        if not self._export_lock.acquire(timeout=deadline_s):  # the previous export is still stuck
            result = MetricExportResult.FAILURE
        else:
            try:
                if self._closed:
                    return False
                result = self.exporter.export(self.collect(), timeout_millis=deadline_s * 1000)
            except Exception as e:  # an exporter bug must not end the service
                log.warning("OTLP export raised: %s", e)
                result = MetricExportResult.FAILURE
            finally:
                self._export_lock.release()
        ok = result is MetricExportResult.SUCCESS
        self.exports["ok" if ok else "failed"] += 1
        now = time.monotonic()
        if not ok and now - self._last_failure_log >= 60:
            self._last_failure_log = now
            log.warning("OTLP export failed", extra={"failed_exports": self.exports["failed"]})
        return ok

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.export_once()

    def shutdown(self) -> None:
        """Stop the timer, export what is there once more (the flush), close the exporter.

        Bounded by FLUSH_TIMEOUT_S or so: a receiver that hangs must not hold a stopping
        service past its orchestrator's grace period.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        flush_s = min(self.timeout_s, FLUSH_TIMEOUT_S)
        self.export_once(timeout_s=flush_s)
        if self._export_lock.acquire(timeout=flush_s):
            try:
                self._closed = True
                self.exporter.shutdown(timeout_millis=flush_s * 1000)
                self._provider.shutdown()
            finally:
                self._export_lock.release()


_active: OtlpExport | None = None


def start_export(
    service: str, section: OtlpSection | None = None, env: Mapping[str, str] | None = None
) -> OtlpExport | None:
    """Start this process's export if configured (see the module docstring); ConfigError if invalid."""
    global _active
    target = otlp_target(section or OtlpSection(), os.environ if env is None else env)
    if target is None:
        return None
    if _active is not None:
        return _active
    try:
        exporter = make_exporter(target.protocol)
    except (ValueError, TypeError) as e:  # the SDK's word on an invalid OTEL_EXPORTER_OTLP_* value
        raise ConfigError(f"OTLP exporter: {e}") from e
    export = OtlpExport(
        resource=service_resource(service),
        exporter=exporter,
        interval_s=target.interval_s,
        timeout_s=target.timeout_s,
    )
    export.start()
    atexit.register(export.shutdown)
    _active = export
    log.info(
        "exporting metrics over OTLP",
        extra={
            "protocol": target.protocol,
            "interval_s": target.interval_s,
            "resource": dict(export.resource.attributes),
        },
    )
    return export


def export_registry(registry: CollectorRegistry) -> None:
    """Export `registry` too, when OTLP export is on."""
    if _active is not None:
        _active.add_registry(registry)


def meter(name: str) -> Meter | None:
    """A meter whose instruments are exported, or None when OTLP export is off."""
    return _active.meter(name) if _active is not None else None


def shutdown() -> None:
    """Flush and stop the export (a no-op when it is off or already stopped)."""
    global _active
    if _active is not None:
        _active.shutdown()
        _active = None

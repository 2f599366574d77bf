"""Prometheus metrics of a training job's GPUs and Andon alerts, under a configurable name prefix."""

from __future__ import annotations

import re
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from .andon import AlertKind, CheckResult
from .monitor import GpuStatus

_PREFIX = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,99}$")


class AndonExporter:
    """Gauges per GPU (temperature, utilisation, memory, power), alert counters, check counters.

    `serve(port)` publishes them on /metrics; pass `registry` to add them to one
    you already serve instead.
    """

    def __init__(self, prefix: str = "gpuhealth_training", registry: CollectorRegistry | None = None) -> None:
        if not _PREFIX.match(prefix):
            raise ValueError(f"metric prefix {prefix!r} is not a Prometheus metric name")
        p = prefix.rstrip("_") + "_"
        self.prefix = p
        self.registry = registry if registry is not None else CollectorRegistry()
        r, gpu = self.registry, ["gpu", "uuid"]
        self.temp = Gauge(p + "gpu_temp_celsius", "GPU temperature", gpu, registry=r)
        self.util = Gauge(p + "gpu_util_ratio", "GPU utilisation (0-1)", gpu, registry=r)
        self.memory = Gauge(p + "gpu_memory_used_ratio", "Framebuffer used / total", gpu, registry=r)
        self.power = Gauge(p + "gpu_power_watts", "Power draw", gpu, registry=r)
        self.power_limit = Gauge(p + "gpu_power_limit_watts", "Enforced power limit", gpu, registry=r)
        self.alerts = Counter(p + "alerts", "Andon alerts opened", ["kind", "severity"], registry=r)
        self.open = Gauge(p + "alerts_open", "Andon alerts open now", ["kind"], registry=r)
        self.checks = Counter(p + "checks", "GPU checks run", registry=r)
        self.read_errors = Counter(p + "read_errors", "GPU reads that failed", registry=r)
        self.last_check = Gauge(
            p + "last_check_timestamp_seconds", "When the GPUs were last read", registry=r
        )
        for kind in AlertKind:
            self.open.labels(kind.value).set(0)
        self._stop: Callable[[], None] | None = None

    def observe(self, statuses: list[GpuStatus], result: CheckResult | None) -> None:
        self.checks.inc()
        if result is None:
            self.read_errors.inc()
            return
        self.last_check.set_to_current_time()
        for s in statuses:
            labels = (str(s.index), s.uuid)
            for gauge, value in (
                (self.temp, s.temp_c),
                (self.util, None if s.util_pct is None else s.util_pct / 100),
                (self.memory, s.memory_used_ratio),
                (self.power, s.power_w),
                (self.power_limit, s.power_limit_w),
            ):
                gauge.labels(*labels).set(float("nan") if value is None else value)
        for alert in result.opened:
            self.alerts.labels(alert.kind.value, alert.severity).inc()
        counts = dict.fromkeys(AlertKind, 0)
        for alert in result.active:
            counts[alert.kind] += 1
        for kind, n in counts.items():
            self.open.labels(kind.value).set(n)

    def serve(self, port: int = 9510, bind: str = "127.0.0.1") -> int:
        """Serve /metrics (port 0: any free port); returns the port. OSError if it is taken."""
        server, _ = start_http_server(port, addr=bind, registry=self.registry)
        self._stop = server.shutdown
        return int(server.server_address[1])

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

"""The Andon checker: thermal throttling, memory pressure, power limit and idle/hang alerts per GPU.

The conditions are the scorer's Andon alerts (services/scorer/cycle.py) applied
to one job's GPUs at each check, with thresholds from the same rules file
(see thresholds.py). A check reports the alerts that opened, those still
active, and those that resolved, so a hook hears of an alert once, not at
every check while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuhealth.contract.training import AlertKind
from gpuhealth.gpu.driver_codes import ClockEventReason as Reason

from .monitor import GpuStatus
from .thresholds import AndonThresholds

THERMAL_REASONS = Reason.SW_THERMAL_SLOWDOWN | Reason.HW_THERMAL_SLOWDOWN
__all__ = ["Alert", "AlertKind", "AndonChecker", "CheckResult"]


@dataclass(frozen=True, slots=True)
class Alert:
    """One condition on one GPU: what was seen (`value`, in `unit`) against which `threshold`."""

    kind: AlertKind
    severity: str  # "warning" | "critical"
    gpu_index: int
    gpu_uuid: str
    value: float | None
    threshold: float
    unit: str
    summary: str
    time: datetime
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return f"GPU {self.gpu_index} ({self.gpu_uuid})"

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind.value} on {self.device}: {self.summary}"


def thermal_alert(s: GpuStatus, t: AndonThresholds) -> Alert | None:
    limit = t.thermal_limit_c(s.slowdown_c)
    reasons = (
        Reason(s.clocks_event_reasons & THERMAL_REASONS) if s.clocks_event_reasons is not None else Reason(0)
    )
    hot = s.temp_c is not None and s.temp_c >= limit
    if not hot and not reasons:
        return None
    slowdown = s.slowdown_c if s.slowdown_c is not None else t.default_slowdown_c
    critical = bool(reasons & Reason.HW_THERMAL_SLOWDOWN) or (s.temp_c is not None and s.temp_c >= slowdown)
    why = f"{s.temp_c:.0f} °C, limit {limit:.0f} °C" if s.temp_c is not None else "temperature unknown"
    if reasons:
        why += f", throttling: {', '.join(Reason.names(reasons))}"
    return Alert(
        AlertKind.THERMAL,
        "critical" if critical else "warning",
        s.index,
        s.uuid,
        s.temp_c,
        limit,
        "C",
        f"thermal: {why}",
        s.time,
        {"slowdown_c": slowdown, "reasons": Reason.names(reasons)},
    )


def memory_alert(s: GpuStatus, t: AndonThresholds) -> Alert | None:
    ratio = s.memory_used_ratio
    if ratio is None or ratio < t.memory_used_ratio:
        return None
    return Alert(
        AlertKind.MEMORY_PRESSURE,
        "warning",
        s.index,
        s.uuid,
        ratio,
        t.memory_used_ratio,
        "ratio",
        f"memory pressure: framebuffer {ratio:.0%} used (limit {t.memory_used_ratio:.0%})",
        s.time,
        {"fb_used_mib": s.fb_used_mib, "fb_total_mib": s.fb_total_mib},
    )


def power_alert(s: GpuStatus, t: AndonThresholds) -> Alert | None:
    if s.power_w is None or not s.power_limit_w:
        return None
    limit = t.power_limit_ratio * s.power_limit_w
    if s.power_w < limit:
        return None
    return Alert(
        AlertKind.POWER_LIMIT,
        "warning",
        s.index,
        s.uuid,
        s.power_w,
        limit,
        "W",
        f"power limit: drawing {s.power_w:.0f} W of {s.power_limit_w:.0f} W",
        s.time,
        {"power_limit_w": s.power_limit_w, "ratio": t.power_limit_ratio},
    )


def idle_alert(s: GpuStatus, t: AndonThresholds, idle_s: float | None) -> Alert | None:
    """`idle_s`: how long this GPU has been below the idle utilisation (None: it is not)."""
    if idle_s is None or idle_s < t.idle_for_s:
        return None
    return Alert(
        AlertKind.IDLE,
        "warning",
        s.index,
        s.uuid,
        idle_s,
        t.idle_for_s,
        "s",
        f"idle/hang: utilisation below {t.idle_util_pct:g}% for {idle_s:.1f} s",
        s.time,
        {"util_pct": s.util_pct, "util_below_pct": t.idle_util_pct},
    )


@dataclass(slots=True)
class CheckResult:
    opened: list[Alert] = field(default_factory=list)
    active: list[Alert] = field(default_factory=list)
    resolved: list[Alert] = field(default_factory=list)


class AndonChecker:
    """Alerts for the GPUs' statuses; thresholds from the rules file unless given (or overridden)."""

    def __init__(
        self, thresholds: AndonThresholds | None = None, *, rules: Path | str | None = None, **overrides: Any
    ) -> None:
        if thresholds is None:
            thresholds = AndonThresholds.from_rules(rules, **overrides)
        elif overrides:
            thresholds = thresholds.override(**overrides)
        self.thresholds = thresholds
        self._idle_since: dict[str, float] = {}
        self._open: dict[tuple[str, AlertKind], Alert] = {}

    def idle_for(self, status: GpuStatus, now: float) -> float | None:
        """Track how long a GPU has been idle, as of monotonic time `now`."""
        if status.util_pct is None or status.util_pct >= self.thresholds.idle_util_pct:
            self._idle_since.pop(status.uuid, None)
            return None
        since = self._idle_since.setdefault(status.uuid, now)
        return max(0.0, now - since)

    def evaluate(self, status: GpuStatus, now: float) -> list[Alert]:
        t = self.thresholds
        found = [
            thermal_alert(status, t),
            memory_alert(status, t),
            power_alert(status, t),
            idle_alert(status, t, self.idle_for(status, now)),
        ]
        return [a for a in found if a is not None]

    def check(self, statuses: list[GpuStatus], now: float) -> CheckResult:
        """Alerts now; opened/resolved against the previous check. A GPU absent from `statuses`
        keeps its open alerts (it was not read, so nothing was seen to clear them)."""
        result = CheckResult()
        seen = {s.uuid for s in statuses}
        current: dict[tuple[str, AlertKind], Alert] = {}
        for status in statuses:
            for alert in self.evaluate(status, now):
                current[(alert.gpu_uuid, alert.kind)] = alert
        for key, alert in current.items():
            (result.active if key in self._open else result.opened).append(alert)
        for key, alert in list(self._open.items()):
            if key not in current and key[0] in seen:
                result.resolved.append(alert)
                del self._open[key]
        self._open.update(current)
        result.active = result.opened + result.active
        return result

    @property
    def open_alerts(self) -> list[Alert]:
        return list(self._open.values())

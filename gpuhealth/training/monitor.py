"""GpuMonitor: reads the job's GPUs through the collector's source and keeps a short history of each."""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .sources import GpuSource, SourceKind, SourceReading, open_source
from .sparkline import sparkline

HISTORY_METRICS = ("temp_c", "util_pct", "memory_used_ratio", "power_w")


def _number(value: Any, *, upper: float = 1e9) -> float | None:
    """A reading fit to compare with a threshold, or None (missing, NaN, inf, negative, absurd)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= upper else None


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """One GPU at one check: what the Andon rules look at. None: the GPU did not say."""

    index: int
    uuid: str
    model: str
    time: datetime
    temp_c: float | None = None
    slowdown_c: float | None = None
    util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    clocks_event_reasons: int | None = None

    @property
    def memory_used_ratio(self) -> float | None:
        if self.fb_used_mib is None or not self.fb_total_mib:
            return None
        return self.fb_used_mib / self.fb_total_mib

    @property
    def device(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


def statuses_from(reading: SourceReading) -> list[GpuStatus]:
    out = []
    for gpu in reading.gpus:
        m = gpu.metrics
        reasons = m.get("clocks_event_reasons")
        out.append(
            GpuStatus(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                time=gpu.time or reading.read_at,
                temp_c=_number(m.get("gpu_temp_c"), upper=250),
                slowdown_c=_number(m.get("slowdown_temp_c"), upper=250),
                util_pct=_number(m.get("gpu_util_pct"), upper=100),
                fb_used_mib=_number(m.get("fb_used_mib")),
                fb_total_mib=_number(m.get("fb_total_mib")),
                power_w=_number(m.get("power_usage_w"), upper=10_000),
                power_limit_w=_number(m.get("power_limit_w"), upper=10_000),
                clocks_event_reasons=int(reasons) if _number(reasons) is not None else None,  # type: ignore[arg-type]
            )
        )
    return out


def visible_devices(env: dict[str, str] | os._Environ[str] = os.environ) -> list[int | str] | None:
    """CUDA_VISIBLE_DEVICES as NVML indices or UUID prefixes; None when unset (every GPU)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[int | str] = []
    for item in (x.strip() for x in raw.split(",")):
        if item.isdigit():
            out.append(int(item))
        elif item.startswith(("GPU-", "MIG-")):
            out.append(item)
        else:
            break  # CUDA ignores everything after the first invalid entry
    return out


class GpuMonitor:
    """Reads the GPUs (all of them, or `devices`: NVML indices or UUID prefixes) and keeps their history.

    `devices=None` follows CUDA_VISIBLE_DEVICES when it is set. `source` is any
    object with the collector's `read()`/`close()`; by default NVML (or `nvml`,
    a stand-in for the `pynvml` module), else nvidia-smi.
    """

    def __init__(
        self,
        source: GpuSource | None = None,
        *,
        devices: Sequence[int | str] | None = None,
        history: int = 120,
        source_kind: SourceKind = "auto",
        nvml: Any | None = None,
        smi_runner: Callable[[list[str]], str] | None = None,
    ) -> None:
        self.source = (
            source if source is not None else open_source(source_kind, nvml=nvml, smi_runner=smi_runner)
        )
        self.devices = list(devices) if devices is not None else visible_devices()
        self.history_len = max(1, history)
        self.history: dict[str, dict[str, deque[float | None]]] = {}
        self.last: list[GpuStatus] = []

    def _wanted(self, status: GpuStatus) -> bool:
        if self.devices is None:
            return True
        return any(
            status.index == d if isinstance(d, int) else status.uuid.startswith(d) for d in self.devices
        )

    def read(self) -> list[GpuStatus]:
        """One reading of the watched GPUs; SourceError when the source cannot answer."""
        statuses = [s for s in statuses_from(self.source.read()) if self._wanted(s)]
        for s in statuses:
            series = self.history.setdefault(
                s.uuid, {name: deque(maxlen=self.history_len) for name in HISTORY_METRICS}
            )
            for name in HISTORY_METRICS:
                series[name].append(getattr(s, name))
        self.last = statuses
        return statuses

    def series(self, uuid: str, metric: str) -> list[float | None]:
        if metric not in HISTORY_METRICS:
            raise KeyError(f"no history of {metric!r}: one of {', '.join(HISTORY_METRICS)}")
        return list(self.history.get(uuid, {}).get(metric, ()))

    def summary(self, width: int = 30) -> str:
        """One line per GPU: the latest values and a sparkline of each metric's history."""
        lines = []
        for s in self.last:
            mem = s.memory_used_ratio

            def spark(
                metric: str, lo: float | None = None, hi: float | None = None, uuid: str = s.uuid
            ) -> str:
                return sparkline(self.series(uuid, metric), width=width, lo=lo, hi=hi)

            lines.append(
                f"{s.device} {s.model}: "
                f"temp {_fmt(s.temp_c, '°C')} {spark('temp_c')} | "
                f"util {_fmt(s.util_pct, '%')} {spark('util_pct', 0, 100)} | "
                f"mem {_fmt(None if mem is None else mem * 100, '%')} {spark('memory_used_ratio', 0, 1)} | "
                f"power {_fmt(s.power_w, 'W')} {spark('power_w')}"
            )
        return "\n".join(lines)

    def close(self) -> None:
        self.source.close()


def _fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.0f}{unit}"

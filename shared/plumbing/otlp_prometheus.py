"""A service's Prometheus registry as OpenTelemetry metrics, so /metrics and OTLP say the same thing.

Counters become cumulative monotonic sums (their `_created` sample is the
start time), gauges stay gauges, histograms keep their buckets (Prometheus'
cumulative `le` counts become OTLP's per-bucket counts), and labels become
attributes. Names stay the Prometheus family names, so a dashboard reads the
same series from either path. Summaries (no service here has one) export
their count and sum as sums; quantiles have no OTLP sum/gauge form.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PromFamily

Labels = tuple[tuple[str, str], ...]
CUMULATIVE = AggregationTemporality.CUMULATIVE


def registry_metrics(registry: CollectorRegistry, *, start_ns: int, now_ns: int) -> list[Metric]:
    """Every family of `registry`, converted; `start_ns` is the start of counters with no `_created`."""
    out: list[Metric] = []
    for family in registry.collect():
        out.extend(family_metrics(family, start_ns=start_ns, now_ns=now_ns))
    return out


def family_metrics(family: PromFamily, *, start_ns: int, now_ns: int) -> list[Metric]:
    """One Prometheus family as OTel metrics (usually one; none for an empty family)."""
    if family.type == "counter":
        return _counter(family, start_ns, now_ns)
    if family.type == "histogram":
        return _histogram(family, start_ns, now_ns)
    if family.type == "summary":
        return _summary(family, start_ns, now_ns)
    # gauge, info, stateset, enum, unknown: the value as it is now
    points = [
        NumberDataPoint(dict(s.labels), start_ns, now_ns, _number(s.value))
        for s in family.samples
        if not s.name.endswith("_created")
    ]
    return [_metric(family, family.name, Gauge(points))] if points else []


def _counter(family: PromFamily, start_ns: int, now_ns: int) -> list[Metric]:
    created = _created(family)
    points = [
        NumberDataPoint(dict(s.labels), created.get(_key(s.labels), start_ns), now_ns, _number(s.value))
        for s in family.samples
        if s.name.endswith("_total")
    ]
    if not points:
        return []
    return [_metric(family, family.name, Sum(points, CUMULATIVE, is_monotonic=True))]


def _histogram(family: PromFamily, start_ns: int, now_ns: int) -> list[Metric]:
    created = _created(family)
    buckets: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    sums: dict[Labels, float] = {}
    counts: dict[Labels, float] = {}
    for s in family.samples:
        if s.name.endswith("_bucket"):
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            buckets[_key(labels)].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            sums[_key(s.labels)] = s.value
        elif s.name.endswith("_count"):
            counts[_key(s.labels)] = s.value
    points = []
    for key, cumulative in buckets.items():
        bounds, bucket_counts = per_bucket(cumulative)
        points.append(
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=created.get(key, start_ns),
                time_unix_nano=now_ns,
                count=int(counts.get(key, sum(bucket_counts))),
                sum=sums.get(key, 0.0),
                bucket_counts=bucket_counts,
                explicit_bounds=bounds,
                min=None,  # type: ignore[arg-type]  # Prometheus does not keep them; OTLP leaves them unset
                max=None,  # type: ignore[arg-type]
            )
        )
    if not points:
        return []
    return [_metric(family, family.name, Histogram(points, CUMULATIVE))]


def per_bucket(cumulative: Iterable[tuple[float, float]]) -> tuple[list[float], list[int]]:
    """Prometheus' (le, count of values <= le) into OTLP's finite bounds and per-bucket counts.

    The +Inf bucket is the last count; a missing +Inf (not valid exposition) is
    treated as no values above the last bound.
    """
    ordered = sorted(cumulative)
    bounds = [le for le, _ in ordered if not math.isinf(le)]
    finite = [c for le, c in ordered if not math.isinf(le)]
    total = next((c for le, c in ordered if math.isinf(le)), finite[-1] if finite else 0.0)
    counts: list[int] = []
    previous = 0.0
    for c in [*finite, total]:
        counts.append(max(0, int(c - previous)))
        previous = max(previous, c)
    return bounds, counts


def _summary(family: PromFamily, start_ns: int, now_ns: int) -> list[Metric]:
    created = _created(family)
    out = []
    for suffix in ("_count", "_sum"):
        points = [
            NumberDataPoint(dict(s.labels), created.get(_key(s.labels), start_ns), now_ns, _number(s.value))
            for s in family.samples
            if s.name == family.name + suffix
        ]
        if points:
            out.append(_metric(family, family.name + suffix, Sum(points, CUMULATIVE, is_monotonic=True)))
    return out


def _created(family: PromFamily) -> dict[Labels, int]:
    return {
        _key(s.labels): int(s.value * 1e9)
        for s in family.samples
        if s.name.endswith("_created") and math.isfinite(s.value)
    }


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def _metric(family: PromFamily, name: str, data: Gauge | Sum | Histogram) -> Metric:
    return Metric(name=name, description=family.documentation, unit=family.unit or "", data=data)

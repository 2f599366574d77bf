"""The scorer's verdicts as Prometheus series: per GPU and subsystem state, score and open alerts.

A team that lives in Prometheus/Alertmanager gets the verdicts without querying
TimescaleDB (deploy/prometheus/rules/ holds the alerting rules over these series).

Cardinality is bounded by the fleet: labels are only `gpu_uuid`, `hostname`,
`subsystem` (a fixed set) and `severity` (info/warning/critical). The series are
rebuilt from the database after each cycle, for the GPUs this scorer process
judges (its share of the fleet: ownership.py), so a GPU that leaves the fleet,
or moves to another scorer, leaves this process's exposition with it, rather
than its last verdict lingering as a stale series; each GPU is exposed by the
one scorer that holds it. A failed cycle keeps the previous snapshot;
`gpuhealth_verdicts_as_of_seconds` tells how old it is.

States are numbers so rules can compare them: 0 healthy, 1 degraded, 2 unhealthy.
Acknowledged alerts are not counted as open: an operator's acknowledgement in the
API is what silences the Prometheus alert.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.contract.models_health import ALERT_SEVERITIES, HEALTH_STATES
from shared.store import alerts, health

STATE_CODE: dict[str, int] = {state: code for code, state in enumerate(HEALTH_STATES)}
SEVERITIES = ALERT_SEVERITIES


@dataclass(slots=True)
class GpuVerdicts:
    hostname: str
    state: str
    score: float
    subsystems: dict[str, str] = field(default_factory=dict)
    open_alerts: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class VerdictSnapshot:
    as_of: datetime | None = None
    gpus: dict[str, GpuVerdicts] = field(default_factory=dict)


def read_snapshot(conn: Any, as_of: datetime, gpus: Collection[str]) -> VerdictSnapshot:
    """The verdicts of `gpus` after the cycle of `as_of` (call after it committed)."""
    snap = VerdictSnapshot(as_of=as_of)
    for scored in health.scored_gpus(conn, gpus):
        snap.gpus[scored["gpu_uuid"]] = GpuVerdicts(
            hostname=scored["hostname"], state=scored["state"], score=scored["score"]
        )
    for uuid, sub, state in health.scored_subsystems(conn, gpus):
        gpu = snap.gpus.get(uuid)
        if gpu is not None:
            gpu.subsystems[sub] = state
    for uuid, severity, n in alerts.open_counts(conn, gpus):
        gpu = snap.gpus.get(uuid)
        if gpu is not None:
            gpu.open_alerts[severity] = n
    return snap


class VerdictCollector(Collector):
    """Exposes the last snapshot; `refresh` swaps in a new one after each cycle."""

    def __init__(self) -> None:
        self._snapshot = VerdictSnapshot()

    def refresh(self, conn: Any, as_of: datetime, gpus: Collection[str]) -> None:
        self._snapshot = read_snapshot(conn, as_of, gpus)

    def states(self) -> dict[str, int]:
        """The exposed GPUs by overall state."""
        counts: dict[str, int] = {}
        for gpu in self._snapshot.gpus.values():
            counts[gpu.state] = counts.get(gpu.state, 0) + 1
        return counts

    def replace(self, snapshot: VerdictSnapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._snapshot  # one reference: a refresh mid-scrape cannot mix two cycles
        p = "gpuhealth_gpu_"
        state = GaugeMetricFamily(
            p + "state",
            "Overall verdict of the GPU: 0 healthy, 1 degraded, 2 unhealthy",
            labels=["gpu_uuid", "hostname"],
        )
        score = GaugeMetricFamily(
            p + "health_score", "Health score of the GPU, 0 (worst) to 100", labels=["gpu_uuid", "hostname"]
        )
        sub_state = GaugeMetricFamily(
            p + "subsystem_state",
            "Verdict per subsystem: 0 healthy, 1 degraded, 2 unhealthy",
            labels=["gpu_uuid", "hostname", "subsystem"],
        )
        alerts = GaugeMetricFamily(
            p + "open_alerts",
            "Open (unacknowledged) alerts on the GPU by severity",
            labels=["gpu_uuid", "hostname", "severity"],
        )
        for uuid, gpu in sorted(snap.gpus.items()):
            state.add_metric([uuid, gpu.hostname], STATE_CODE.get(gpu.state, 2))
            score.add_metric([uuid, gpu.hostname], gpu.score)
            for sub, sub_verdict in sorted(gpu.subsystems.items()):
                sub_state.add_metric([uuid, gpu.hostname, sub], STATE_CODE.get(sub_verdict, 2))
            for severity in SEVERITIES:
                alerts.add_metric([uuid, gpu.hostname, severity], gpu.open_alerts.get(severity, 0))
        as_of = GaugeMetricFamily(
            "gpuhealth_verdicts_as_of_seconds", "Unix time of the exposed verdicts (0: none yet)"
        )
        as_of.add_metric([], snap.as_of.timestamp() if snap.as_of else 0.0)
        scored = GaugeMetricFamily("gpuhealth_verdicts_gpus", "GPUs in the exposed verdicts")
        scored.add_metric([], len(snap.gpus))
        yield from (state, score, sub_state, alerts, as_of, scored)

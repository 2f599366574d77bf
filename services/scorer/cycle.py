"""One scoring cycle: features -> verdicts, status, alerts, predictions -> database and Kafka.

Written in one transaction: verdict *changes* (gpu_health history and
gpu_health_current), every GPU's status line (gpu_status), alerts opened once,
updated while they last and resolved when their evidence is gone (an operator's
acknowledgement is kept), and predictions when they moved. Then the changes go
to the gpu-health and gpu-alerts topics, after the commit, so a message never
announces what the database does not hold.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.store import alerts, health, notify
from shared.store.errors import translated
from shared.store.health import PredictionRow, StatusRow, VerdictRow

from .features import Conn, GpuFeatures, read_features
from .messages import Message, alert_opened, alert_resolved, verdict_changed
from .predict import Prediction, predict_all
from .rules import SUBSYSTEMS, Verdict, evaluate, overall, score
from .rules_config import Rules

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DesiredAlert:
    kind: str
    severity: str
    summary: str
    evidence: dict[str, Any]


@dataclass(slots=True)
class CycleResult:
    as_of: datetime
    gpus: int = 0
    states: dict[str, int] = field(default_factory=dict)
    verdict_changes: int = 0
    alerts_opened: int = 0
    alerts_resolved: int = 0
    predictions_written: int = 0
    predictions: dict[str, Prediction] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)


def desired_alerts(g: GpuFeatures, verdicts: dict[str, Verdict], rules: Rules) -> list[DesiredAlert]:
    """Andon cord: every unhealthy verdict, plus the operational conditions worth a look."""
    out = [
        DesiredAlert(f"unhealthy_{v.subsystem}", "critical", f"{v.subsystem}: {v.rule}", v.evidence)
        for v in verdicts.values()
        if v.state == "unhealthy"
    ]
    if verdicts["thermal"].state == "degraded":
        out.append(
            DesiredAlert("thermal", "warning", "near the slowdown temperature", verdicts["thermal"].evidence)
        )
    if g.fb_used_mib is not None and g.fb_total_mib:
        ratio = g.fb_used_mib / g.fb_total_mib
        if ratio >= rules.memory.fb_used_ratio_alert:
            out.append(DesiredAlert("memory_pressure", "warning", f"framebuffer {ratio:.0%} used",
                                    {"fb_used_mib": g.fb_used_mib, "fb_total_mib": g.fb_total_mib}))  # fmt: skip
    if (
        g.power_avg is not None
        and g.power_limit_w
        and g.power_avg >= rules.power.at_limit_ratio_alert * g.power_limit_w
    ):
        out.append(DesiredAlert("power_limit", "warning", "drawing at its power limit",
                                {"power_avg_w": round(g.power_avg, 1), "power_limit_w": g.power_limit_w}))  # fmt: skip
    idle = rules.idle
    if (
        g.pod
        and g.util_max_idle_window is not None
        and g.util_max_idle_window < idle.util_pct_below
        and g.idle_minutes * 60 >= idle.for_s
        and verdicts["availability"].state == "healthy"
    ):
        out.append(DesiredAlert("idle_while_allocated", "warning", f"pod {g.pod} holds an idle GPU: possible hang",
                                {"pod": g.pod, "util_max_pct": g.util_max_idle_window, "for_s": idle.for_s}))  # fmt: skip
    return out


def run_cycle(
    conn: Conn, as_of: datetime, rules: Rules, predictions: dict[str, Prediction] | None
) -> CycleResult:
    """Score every GPU as of `as_of`; `predictions` None means compute them this cycle."""
    result = CycleResult(as_of=as_of)
    features = read_features(conn, as_of, rules)
    fresh_predictions = predictions is None
    if predictions is None:
        predictions = predict_all(conn, as_of, rules)
    result.predictions = predictions
    current = health.current_states(conn)
    open_alerts = alerts.unresolved(conn)
    wanted: dict[tuple[str, str], DesiredAlert] = {}
    status_rows: list[StatusRow] = []
    history_rows: list[VerdictRow] = []
    current_rows: list[VerdictRow] = []
    for uuid, g in features.items():
        verdicts = evaluate(g, rules, as_of)
        prediction = predictions.get(uuid) or Prediction(uuid, 0.0, 0.0)
        state, action = overall(verdicts)
        points, grade = score(verdicts, prediction.p_fail_30d, rules)
        result.states[state] = result.states.get(state, 0) + 1
        reasons = [
            {"subsystem": v.subsystem, "state": v.state, "rule": v.rule, "action": v.action}
            for v in verdicts.values() if v.state != "healthy"
        ]  # fmt: skip
        status_rows.append(StatusRow(uuid, state, points, grade, action, reasons, as_of))
        for sub in SUBSYSTEMS:
            v = verdicts[sub]
            before = current.get((uuid, sub))
            # A healthy verdict that stays healthy has nothing new to say: skip the write
            # (at 10,000 GPUs that is ~70,000 upserts a cycle). Non-healthy ones refresh
            # their evidence every cycle.
            row = VerdictRow(uuid, sub, v.state, v.rule, v.evidence, as_of)
            if before != v.state or v.state != "healthy":
                current_rows.append(row)
            # A change of state, except a new GPU starting healthy, is history worth keeping.
            if before != v.state and (before is not None or v.state != "healthy"):
                history_rows.append(row)
                if message := verdict_changed(
                    as_of=as_of, gpu_uuid=uuid, hostname=g.hostname, subsystem=sub, state=v.state,
                    previous=before, rule=v.rule, action=v.action, evidence=v.evidence,
                ):  # fmt: skip
                    result.messages.append(message)
        for alert in desired_alerts(g, verdicts, rules):
            wanted[(uuid, alert.kind)] = alert
    result.gpus = len(features)
    result.verdict_changes = len(history_rows)
    fresh = [
        PredictionRow(p.gpu_uuid, p.p_fail_7d, p.p_fail_30d, p.reasons, as_of) for p in predictions.values()
    ] if fresh_predictions else []  # fmt: skip
    health.write_verdicts(
        conn, statuses=status_rows, current=current_rows, changes=history_rows, predictions=fresh
    )
    result.predictions_written = len(fresh)
    _write_alerts(conn, as_of, wanted, open_alerts, result)
    # Heard at the commit by the API's cache (services/api/cache.py): its answers end with this cycle.
    notify.announce_scored(conn)
    with translated(conn):
        conn.commit()
    return result


def _write_alerts(
    conn: Conn,
    as_of: datetime,
    wanted: dict[tuple[str, str], DesiredAlert],
    open_alerts: dict[tuple[str, str], int],
    result: CycleResult,
) -> None:
    for (uuid, kind), alert in wanted.items():
        if (uuid, kind) in open_alerts:
            alerts.refresh_alert(conn, open_alerts[(uuid, kind)], severity=alert.severity, summary=alert.summary,
                                 evidence=alert.evidence, as_of=as_of)  # fmt: skip
            continue
        alert_id = alerts.open_alert(conn, uuid, kind, severity=alert.severity, summary=alert.summary,
                                     evidence=alert.evidence, as_of=as_of)  # fmt: skip
        result.alerts_opened += 1
        if message := alert_opened(
            as_of=as_of, alert_id=alert_id, gpu_uuid=uuid, kind=kind, severity=alert.severity,
            summary=alert.summary, evidence=alert.evidence,
        ):  # fmt: skip
            result.messages.append(message)
    for (uuid, kind), alert_id in open_alerts.items():
        if (uuid, kind) in wanted:
            continue
        alerts.resolve_alert(conn, alert_id, as_of)
        result.alerts_resolved += 1
        if message := alert_resolved(as_of=as_of, alert_id=alert_id, gpu_uuid=uuid, kind=kind):
            result.messages.append(message)

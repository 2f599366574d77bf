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

from psycopg.types.json import Jsonb

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
    current = {
        (str(u), str(s)): str(st)
        for u, s, st in conn.execute("SELECT gpu_uuid, subsystem, state FROM gpu_health_current")
    }
    open_alerts = {
        (str(u), str(k)): int(i)
        for i, u, k in conn.execute("SELECT id, gpu_uuid, kind FROM gpu_alerts WHERE state <> 'resolved'")
    }
    wanted: dict[tuple[str, str], DesiredAlert] = {}
    status_rows, history_rows, current_rows = [], [], []
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
        status_rows.append((uuid, state, points, grade, action, Jsonb(reasons), as_of))
        for sub in SUBSYSTEMS:
            v = verdicts[sub]
            before = current.get((uuid, sub))
            # A healthy verdict that stays healthy has nothing new to say: skip the write
            # (at 10,000 GPUs that is ~70,000 upserts a cycle). Non-healthy ones refresh
            # their evidence every cycle.
            if before != v.state or v.state != "healthy":
                current_rows.append((uuid, sub, v.state, v.rule, Jsonb(v.evidence), as_of))
            # A change of state, except a new GPU starting healthy, is history worth keeping.
            if before != v.state and (before is not None or v.state != "healthy"):
                history_rows.append((as_of, uuid, sub, v.state, v.rule, Jsonb(v.evidence)))
                if message := verdict_changed(
                    as_of=as_of, gpu_uuid=uuid, hostname=g.hostname, subsystem=sub, state=v.state,
                    previous=before, rule=v.rule, action=v.action, evidence=v.evidence,
                ):  # fmt: skip
                    result.messages.append(message)
        for alert in desired_alerts(g, verdicts, rules):
            wanted[(uuid, alert.kind)] = alert
    result.gpus = len(features)
    result.verdict_changes = len(history_rows)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, reasons, as_of, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, now()) ON CONFLICT (gpu_uuid) DO UPDATE SET"
            " state = EXCLUDED.state, score = EXCLUDED.score, grade = EXCLUDED.grade, action = EXCLUDED.action,"
            " reasons = EXCLUDED.reasons, as_of = EXCLUDED.as_of, updated_at = now()",
            status_rows,
        )
        cur.executemany(
            "INSERT INTO gpu_health_current (gpu_uuid, subsystem, state, rule, evidence, since, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (gpu_uuid, subsystem) DO UPDATE SET"
            " since = CASE WHEN gpu_health_current.state = EXCLUDED.state THEN gpu_health_current.since"
            " ELSE EXCLUDED.since END, state = EXCLUDED.state, rule = EXCLUDED.rule,"
            " evidence = EXCLUDED.evidence, updated_at = EXCLUDED.updated_at",
            [(*row, row[-1]) for row in current_rows],
        )
        if history_rows:
            cur.executemany(
                "INSERT INTO gpu_health (time, gpu_uuid, subsystem, state, rule, evidence)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                history_rows,
            )
        _write_alerts(cur, as_of, wanted, open_alerts, result)
        if fresh_predictions:
            rows = [
                (as_of, p.gpu_uuid, p.p_fail_7d, p.p_fail_30d, Jsonb(p.reasons)) for p in predictions.values()
            ]
            cur.executemany(
                "INSERT INTO gpu_failure_predictions (time, gpu_uuid, p_fail_7d, p_fail_30d, reasons)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                rows,
            )
            result.predictions_written = len(rows)
    # Heard at the commit by the API's cache (services/api/cache.py): its answers end with this cycle.
    conn.execute("SELECT pg_notify('gpuhealth_scored', current_schema())")
    conn.commit()
    return result


def _write_alerts(
    cur: Any,
    as_of: datetime,
    wanted: dict[tuple[str, str], DesiredAlert],
    open_alerts: dict[tuple[str, str], int],
    result: CycleResult,
) -> None:
    for (uuid, kind), alert in wanted.items():
        if (uuid, kind) in open_alerts:
            cur.execute(
                "UPDATE gpu_alerts SET severity = %s, summary = %s, evidence = %s, updated_at = %s WHERE id = %s",
                (alert.severity, alert.summary, Jsonb(alert.evidence), as_of, open_alerts[(uuid, kind)]),
            )
            continue
        row = cur.execute(
            "INSERT INTO gpu_alerts (gpu_uuid, kind, severity, state, summary, evidence, opened_at, updated_at)"
            " VALUES (%s, %s, %s, 'open', %s, %s, %s, %s) RETURNING id",
            (uuid, kind, alert.severity, alert.summary, Jsonb(alert.evidence), as_of, as_of),
        ).fetchone()
        result.alerts_opened += 1
        if message := alert_opened(
            as_of=as_of, alert_id=row[0], gpu_uuid=uuid, kind=kind, severity=alert.severity,
            summary=alert.summary, evidence=alert.evidence,
        ):  # fmt: skip
            result.messages.append(message)
    for (uuid, kind), alert_id in open_alerts.items():
        if (uuid, kind) in wanted:
            continue
        cur.execute(
            "UPDATE gpu_alerts SET state = 'resolved', resolved_at = %s, updated_at = %s WHERE id = %s",
            (as_of, as_of, alert_id),
        )
        result.alerts_resolved += 1
        if message := alert_resolved(as_of=as_of, alert_id=alert_id, gpu_uuid=uuid, kind=kind):
            result.messages.append(message)

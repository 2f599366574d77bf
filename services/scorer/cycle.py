"""Judging a set of GPUs: features -> verdicts, status, alerts, predictions -> database and Kafka.

One function, :func:`judge`, serves both of the scorer's paths: its cycle (the
GPUs it owns, every interval) and its event fast path (the GPU an event names, at
once). It reads, then writes in one transaction: each GPU's status line
(gpu_status), claimed against the revision read before the inputs, so a
judgement that read older inputs than one committed since writes nothing for
that GPU (schema/0040); then for the GPUs claimed, verdict *changes* (gpu_health
history and gpu_health_current), alerts opened once (the database refuses a
second open alert of a kind on a GPU, whoever opens it), updated while they last
and resolved when their evidence is gone (an operator's acknowledgement is
kept), and predictions when they moved. The changes go to the gpu-health and
gpu-alerts topics after the commit, so a message never announces what the
database does not hold, and only the writer that made a change announces it.

:func:`assess` (the reads and the rules) and :func:`record` (the writes) are
:func:`judge`'s two halves, apart so the tests can interleave two judgements.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.store import alerts, health, judging, notify
from shared.store.errors import translated
from shared.store.health import PredictionRow, StatusRow, VerdictRow

from .correlation import correlated_alerts
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
    """What one judgement wrote: the GPUs it judged and skipped, and the messages it owes Kafka."""

    as_of: datetime
    gpus: int = 0  # GPUs judged and written
    skipped: set[str] = field(default_factory=set)  # judged since this one read them: written by another
    states: dict[str, int] = field(default_factory=dict)
    verdict_changes: int = 0
    alerts_opened: int = 0
    alerts_resolved: int = 0
    predictions_written: int = 0
    predictions: dict[str, Prediction] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    cut_short: bool = False  # a stop ended it before every GPU it was given was judged

    def add(self, other: CycleResult) -> None:
        """`other`'s judgement (another chunk of the same cycle) counted into this one."""
        self.gpus += other.gpus
        self.skipped |= other.skipped
        for state, n in other.states.items():
            self.states[state] = self.states.get(state, 0) + n
        self.verdict_changes += other.verdict_changes
        self.alerts_opened += other.alerts_opened
        self.alerts_resolved += other.alerts_resolved
        self.predictions_written += other.predictions_written
        self.predictions.update(other.predictions)
        self.messages += other.messages


def desired_alerts(g: GpuFeatures, verdicts: dict[str, Verdict], rules: Rules) -> list[DesiredAlert]:
    """Andon cord: every unhealthy verdict, plus the operational conditions worth a look."""
    out = [
        DesiredAlert(f"unhealthy_{v.subsystem}", "critical", f"{v.subsystem}: {v.rule}", v.evidence)
        for v in verdicts.values()
        if v.state == "unhealthy"
    ]
    out += [
        DesiredAlert(kind, severity, summary, evidence)
        for kind, severity, summary, evidence in correlated_alerts(g)
    ]
    if verdicts["thermal"].state == "degraded":
        out.append(
            DesiredAlert("thermal", "warning", "near the slowdown temperature", verdicts["thermal"].evidence)
        )
    if g.fb_used_mib is not None and g.fb_total_mib:
        ratio = g.fb_used_mib / g.fb_total_mib
        if ratio >= rules.memory.fb_used_ratio_alert:
            out.append(
                DesiredAlert(
                    "memory_pressure",
                    "warning",
                    f"framebuffer {ratio:.0%} used",
                    {"fb_used_mib": g.fb_used_mib, "fb_total_mib": g.fb_total_mib},
                )
            )
    if (
        g.power_avg is not None
        and g.power_limit_w
        and g.power_avg >= rules.power.at_limit_ratio_alert * g.power_limit_w
    ):
        out.append(
            DesiredAlert(
                "power_limit",
                "warning",
                "drawing at its power limit",
                {"power_avg_w": round(g.power_avg, 1), "power_limit_w": g.power_limit_w},
            )
        )
    idle = rules.idle
    if (
        g.pod
        and g.util_max_idle_window is not None
        and g.util_max_idle_window < idle.util_pct_below
        and g.idle_minutes * 60 >= idle.for_s
        and verdicts["availability"].state == "healthy"
    ):
        out.append(
            DesiredAlert(
                "idle_while_allocated",
                "warning",
                f"pod {g.pod} holds an idle GPU: possible hang",
                {"pod": g.pod, "util_max_pct": g.util_max_idle_window, "for_s": idle.for_s},
            )
        )
    return out


@dataclass(slots=True)
class GpuJudgement:
    """One GPU's verdicts, status line and wanted alerts, before anything is written."""

    hostname: str
    verdicts: dict[str, Verdict]
    status: StatusRow
    wanted: list[DesiredAlert]


@dataclass(slots=True)
class Assessment:
    """What a judgement read and decided: each GPU's verdicts, and the revisions its writes are claimed against."""

    as_of: datetime
    revisions: dict[str, int]
    gpus: dict[str, GpuJudgement]
    predictions: dict[str, Prediction]
    fresh: set[str]  # the GPUs whose predictions were computed now (written with their verdicts)

    def part(self, gpus: Collection[str]) -> Assessment:
        """What this assessment decided for `gpus` alone (those of them it judged)."""
        keep = [g for g in gpus if g in self.gpus]
        return Assessment(
            self.as_of,
            {g: self.revisions[g] for g in keep if g in self.revisions},
            {g: self.gpus[g] for g in keep},
            {g: self.predictions[g] for g in keep if g in self.predictions},
            self.fresh.intersection(keep),
        )


def _predictions_for(
    conn: Conn, gpus: Collection[str], given: Mapping[str, Prediction]
) -> dict[str, Prediction]:
    """`given`, and for the GPUs it lacks, their newest prediction in the database (a scorer that has
    just been handed a GPU, or the fast path, which keeps none of its own)."""
    out = {uuid: given[uuid] for uuid in gpus if uuid in given}
    missing = [uuid for uuid in gpus if uuid not in given]
    if missing:
        for row in health.latest_predictions(conn, missing):
            out[row.gpu_uuid] = Prediction(row.gpu_uuid, row.p_fail_7d, row.p_fail_30d, row.reasons)
    return out


def _heard_until(
    conn: Conn, as_of: datetime, rules: Rules, features: Iterable[GpuFeatures]
) -> datetime | None:
    """When the fleet was last heard from, read only when one of `features` has been silent long enough
    for it to matter (a GPU that reported recently is not silent whatever the fleet did)."""
    missing = rules.availability.missing_after_s
    if all(g.last_time is not None and (as_of - g.last_time).total_seconds() <= missing for g in features):
        return None
    return judging.fleet_heard_until(conn, as_of)


def assess(
    conn: Conn,
    as_of: datetime,
    rules: Rules,
    *,
    gpus: Collection[str] | None = None,
    predictions: Mapping[str, Prediction] | None = None,
    predict: Collection[str] = (),
) -> Assessment:
    """Judge `gpus` (None: every GPU) as of `as_of`; nothing written. `predictions` None: computed now for
    all; else those given are used, computed now for the GPUs in `predict`, read for the rest."""
    # The revisions first: whatever commits after this read is newer than these inputs.
    revisions = health.revisions(conn, gpus)
    features = read_features(conn, as_of, rules, gpus)
    if predictions is None:
        known = predict_all(conn, as_of, rules, gpus)
        fresh = set(features)
    else:
        fresh = {uuid for uuid in predict if uuid in features}
        computed = predict_all(conn, as_of, rules, fresh) if fresh else {}
        known = _predictions_for(conn, features, {**predictions, **computed})
    judged: dict[str, GpuJudgement] = {}
    heard_until = _heard_until(conn, as_of, rules, features.values())
    for uuid, g in features.items():
        verdicts = evaluate(g, rules, as_of, heard_until)
        prediction = known.get(uuid) or Prediction(uuid, 0.0, 0.0)
        state, action = overall(verdicts)
        points, grade = score(verdicts, prediction.p_fail_30d, rules)
        reasons = [
            {"subsystem": v.subsystem, "state": v.state, "rule": v.rule, "action": v.action}
            for v in verdicts.values()
            if v.state != "healthy"
        ]
        status = StatusRow(uuid, state, points, grade, action, reasons, as_of)
        judged[uuid] = GpuJudgement(g.hostname, verdicts, status, desired_alerts(g, verdicts, rules))
    return Assessment(as_of, revisions, judged, dict(known), fresh)


def record(conn: Conn, assessment: Assessment) -> CycleResult:
    """Write what `assessment` decided for the GPUs no other judgement wrote since it read them; commit."""
    as_of = assessment.as_of
    result = CycleResult(as_of=as_of, predictions=assessment.predictions)
    claimed = health.claim_statuses(conn, [j.status for j in assessment.gpus.values()], assessment.revisions)
    result.skipped = set(assessment.gpus) - claimed
    # Read under the claim (the status rows are locked): no other judgement of these GPUs is between.
    current = health.current_states(conn, claimed)
    open_alerts = alerts.unresolved(conn, claimed)
    wanted: dict[tuple[str, str], DesiredAlert] = {}
    history_rows: list[VerdictRow] = []
    current_rows: list[VerdictRow] = []
    for uuid in sorted(claimed):
        judged = assessment.gpus[uuid]
        result.states[judged.status.state] = result.states.get(judged.status.state, 0) + 1
        for sub in SUBSYSTEMS:
            v = judged.verdicts[sub]
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
                    as_of=as_of,
                    gpu_uuid=uuid,
                    hostname=judged.hostname,
                    subsystem=sub,
                    state=v.state,
                    previous=before,
                    rule=v.rule,
                    action=v.action,
                    evidence=v.evidence,
                ):
                    result.messages.append(message)
        for alert in judged.wanted:
            wanted[(uuid, alert.kind)] = alert
    result.gpus = len(claimed)
    result.verdict_changes = len(history_rows)
    fresh = [
        PredictionRow(p.gpu_uuid, p.p_fail_7d, p.p_fail_30d, p.reasons, as_of)
        for uuid, p in assessment.predictions.items()
        if uuid in claimed and uuid in assessment.fresh
    ]
    health.write_verdicts(conn, current=current_rows, changes=history_rows, predictions=fresh)
    result.predictions_written = len(fresh)
    _write_alerts(conn, as_of, wanted, open_alerts, result)
    # Heard at the commit by the API's cache (services/api/cache.py): its answers end with this judgement.
    notify.announce_scored(conn)
    with translated(conn):
        conn.commit()
    return result


def judge(
    conn: Conn,
    as_of: datetime,
    rules: Rules,
    *,
    gpus: Collection[str] | None = None,
    predictions: Mapping[str, Prediction] | None = None,
    predict: Collection[str] = (),
) -> CycleResult:
    """Judge `gpus` (None: every GPU) as of `as_of`, write and commit; `predictions` and `predict` as
    :func:`assess` takes them.

    A GPU another judgement wrote after this one read it is left as that one wrote it
    (`CycleResult.skipped`); the caller judges it again if its own news must count."""
    return record(conn, assess(conn, as_of, rules, gpus=gpus, predictions=predictions, predict=predict))


def judge_in_chunks(
    conn: Conn,
    as_of: datetime,
    rules: Rules,
    gpus: Sequence[str],
    *,
    chunk: int,
    predictions: Mapping[str, Prediction] | None = None,
    predict: Collection[str] = (),
    stop: threading.Event | None = None,
    committed: Callable[[CycleResult], None] = lambda _: None,
) -> CycleResult:
    """:func:`judge` over `gpus`: read and judged at once (one read of the inputs, as one judgement
    reads them), then written `chunk` GPUs to a transaction, each chunk's result handed to `committed`
    once it commits; their sum. A chunk's status rows stay locked only while that chunk writes, so the
    event fast path never waits on a whole cycle's writes; a GPU it judged after this read is left as
    it wrote it (the claim, as in :func:`record`). A `stop` set between chunks ends the cycle there (the
    GPUs left keep their verdicts, and are judged by the next cycle, here or in the scorer that takes
    them over)."""
    total = CycleResult(as_of=as_of)
    assessment = assess(conn, as_of, rules, gpus=gpus, predictions=predictions, predict=predict)
    for start in range(0, len(gpus), chunk):
        if stop is not None and stop.is_set():
            total.cut_short = True
            break
        done = record(conn, assessment.part(gpus[start : start + chunk]))
        committed(done)
        total.add(done)
    return total


def run_cycle(
    conn: Conn, as_of: datetime, rules: Rules, predictions: Mapping[str, Prediction] | None
) -> CycleResult:
    """Judge every GPU as of `as_of`; `predictions` None means compute them this cycle."""
    return judge(conn, as_of, rules, predictions=predictions)


def _write_alerts(
    conn: Conn,
    as_of: datetime,
    wanted: dict[tuple[str, str], DesiredAlert],
    open_alerts: dict[tuple[str, str], int],
    result: CycleResult,
) -> None:
    refreshed: list[alerts.Refresh] = []
    for (uuid, kind), alert in wanted.items():
        if (uuid, kind) in open_alerts:
            refreshed.append(
                alerts.Refresh(open_alerts[(uuid, kind)], alert.severity, alert.summary, alert.evidence)
            )
            continue
        alert_id = alerts.open_alert(
            conn,
            uuid,
            kind,
            severity=alert.severity,
            summary=alert.summary,
            evidence=alert.evidence,
            as_of=as_of,
        )
        if alert_id is None:
            continue  # opened by another writer since we read: it announced it
        result.alerts_opened += 1
        if message := alert_opened(
            as_of=as_of,
            alert_id=alert_id,
            gpu_uuid=uuid,
            kind=kind,
            severity=alert.severity,
            summary=alert.summary,
            evidence=alert.evidence,
        ):
            result.messages.append(message)
    alerts.refresh_alerts(conn, refreshed, as_of)
    for (uuid, kind), alert_id in open_alerts.items():
        if (uuid, kind) in wanted or not alerts.resolve_alert(conn, alert_id, as_of):
            continue
        result.alerts_resolved += 1
        if message := alert_resolved(as_of=as_of, alert_id=alert_id, gpu_uuid=uuid, kind=kind):
            result.messages.append(message)

"""The alerts' answers: an alert as stored, and as listed or acknowledged (with its GPU's place)."""

from __future__ import annotations

from shared.models_health import AlertSeverity, AlertState

from . import Answer, ApiTime, NextCursor, StoredObject, Total


class AlertRow(Answer):
    """An alert as gpu_alerts holds it."""

    id: int
    gpu_uuid: str
    kind: str
    severity: AlertSeverity
    state: AlertState
    summary: str
    evidence: StoredObject
    opened_at: ApiTime
    updated_at: ApiTime
    resolved_at: ApiTime | None
    acknowledged_at: ApiTime | None
    acknowledged_by: str | None


class Alert(AlertRow):
    """An alert with its GPU's place: hostname "" (index, rack null) for a GPU no longer in the inventory."""

    hostname: str
    gpu_index: int | None
    rack: str | None


class Alerts(Answer):
    alerts: list[Alert]
    total: Total
    limit: int
    next_cursor: NextCursor

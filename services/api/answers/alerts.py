"""The alerts' answers: an alert as stored, and as listed or acknowledged (with its GPU's place)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from shared.contract.models_health import AlertSeverity, AlertState

from . import Answer, ApiTime, NextCursor, StoredObject, Total

# the alerts of what several GPUs showed together (services/scorer/correlation.py): kind -> scope
SHARED_KINDS = {"job_crash": "job", "node_fault": "node", "rack_fault": "rack"}


class SharedFinding(Answer):
    """What several GPUs showed together: a job's crash, a fault of a host or a rack.

    The alert is held by the first of its GPUs; this names the job (namespace/job, or
    launch/<job key>), host or rack, and every GPU and host it touched (the first 32 listed)."""

    scope: Literal["job", "node", "rack"]
    key: str  # the job, the hostname, the rack
    gpu_count: int
    gpus: list[str]
    hosts: list[str]
    xids: list[int]
    first: str | None
    last: str | None


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
    shared: SharedFinding | None = None  # job_crash, node_fault, rack_fault: the job or place and its GPUs

    @model_validator(mode="before")
    @classmethod
    def _shared(cls, row: Any) -> Any:
        if isinstance(row, dict) and "shared" not in row:
            row = {**row, "shared": shared_finding(row.get("kind"), row.get("evidence"))}
        return row


def shared_finding(kind: Any, evidence: Any) -> dict[str, Any] | None:
    """The finding a job_crash, node_fault or rack_fault alert's evidence names (None: another kind)."""
    scope = SHARED_KINDS.get(kind) if isinstance(kind, str) else None
    if scope is None or not isinstance(evidence, dict) or not isinstance(evidence.get(scope), str):
        return None
    gpus = evidence.get("gpus", [])
    return {
        "scope": scope,
        "key": evidence[scope],
        "gpu_count": evidence.get("gpu_count", len(gpus)),
        "gpus": gpus,
        "hosts": evidence.get("hosts", []),
        "xids": evidence.get("xids", []),
        "first": evidence.get("first"),
        "last": evidence.get("last"),
    }


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

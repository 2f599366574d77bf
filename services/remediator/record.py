"""Every decision, action, outcome and validation as a record: a table row, then a gpu-remediations message.

`event` builds the row, checked by the topic's contract before it is written
(a record the topic could not carry is never stored), in the transaction of
what it records. `Outbox.publish` sends what is unpublished, oldest first,
and marks it once the broker has acknowledged it; a crash in between sends it
again (the record id lets a consumer drop the copy), never loses it.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from shared.contract.models_remediation import RemediationRecord
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.errors import ContractError, GpuHealthError
from shared.plumbing.kafka import JsonProducer
from shared.settings.common import DatabaseSettings
from shared.store import remediation_ledger as ledger
from shared.store.errors import translated
from shared.store.results import Row

from .held import HeldConnection

log = logging.getLogger(__name__)
REMEDIATIONS = TopicSettings.entry("remediations")  # its messages' key and value

_TEXT_LIMIT = 1000


def _clip(value: Any, depth: int = 0) -> Any:
    """A driver's answer as the contract's evidence holds it: names as names, short texts, bounded lists,
    shallow; anything else as its text."""
    if value is None or isinstance(value, bool) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return value
    if isinstance(value, dict) and depth < 4:
        return {_name(k): _clip(v, depth + 1) for k, v in list(value.items())[:64]}
    if isinstance(value, list | tuple) and depth < 4:
        return [_clip(v, depth + 1) for v in list(value)[:100]]
    text = value if isinstance(value, str) else repr(value)
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")[:_TEXT_LIMIT]


def _name(key: object) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", str(key))[:128] or "_"


def event(
    kind: str,
    *,
    at: datetime,
    status: str,
    dry_run: bool,
    node: str = "",
    plan: Row | None = None,
    gpu_uuid: str | None = None,
    action: str | None = None,
    step: str | None = None,
    driver: str | None = None,
    reason: str | None = None,
    seconds: float | None = None,
    answers: dict[str, Any] | None = None,
    response: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One record, as its row; its plan (when given) names the node, the action and what it answers."""
    if plan is not None:
        node = node or str(plan["node"])
        action = action or str(plan["action"])
        answers = answers if answers is not None else plan["detail"].get("answers")
        gpus = list(plan["gpu_uuids"])
        gpu_uuid = gpu_uuid or (gpus[0] if len(gpus) == 1 else None)
    row = {
        "time": at,
        "record_id": str(uuid.uuid4()),
        "kind": kind,
        "remediation_id": int(plan["id"]) if plan is not None else None,
        "gpu_uuid": gpu_uuid,
        "node": node,
        "action": action,
        "step": step,
        "driver": driver,
        "status": status,
        "dry_run": dry_run,
        "reason": reason[:_TEXT_LIMIT] if reason else None,
        "seconds": round(seconds, 6) if seconds is not None else None,
        "answers": answers,
        "response": _clip(response or {}),
    }
    as_record(row)  # refuses what the topic could not carry, before anything is written
    return row


def as_record(row: Row) -> RemediationRecord:
    try:
        return RemediationRecord.model_validate({**row, "record_id": str(row["record_id"])}, strict=False)
    except ValidationError as e:
        first = e.errors()[0]
        raise ContractError(
            f"remediation record: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        ) from e


class Outbox:
    """Publishes the unpublished records to gpu-remediations."""

    def __init__(self, *, db: DatabaseSettings, producer: JsonProducer, topic: str, batch: int = 500) -> None:
        self.db, self.producer, self.topic, self.batch = db, producer, topic, batch
        self.held = HeldConnection(db)
        self.published = 0

    def publish(self, flush_timeout_s: float = 10.0) -> int:
        """Send one batch of what is unpublished; how many the broker acknowledged."""
        with self.held.session() as conn:
            rows = ledger.outbox(conn, self.batch)
            if not rows:
                return 0
            failed_before = self.producer.failed
            sent = []
            for row in rows:
                try:
                    record = as_record(row)
                except ContractError as e:  # written by an older version, or by hand: kept, not published
                    log.error("record %s cannot be published: %s", row["record_id"], e)
                    sent.append((row["record_id"], row["time"]))
                    continue
                self.producer.produce(self.topic, *REMEDIATIONS.encode(record))
                sent.append((row["record_id"], row["time"]))
            remaining = self.producer.flush(flush_timeout_s)
            if remaining or self.producer.failed != failed_before:
                raise GpuHealthError(
                    f"gpu-remediations: {remaining} records not acknowledged; sent again later"
                )
            ledger.mark_published(conn, sent)
            with translated(conn):
                conn.commit()
        self.published += len(sent)
        return len(sent)

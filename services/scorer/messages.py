"""The scorer's gpu-health and gpu-alerts messages, built and checked by their contract (models_health).

A message the contract refuses (a GPU id or hostname in the database that the
topic cannot carry) is logged and left out; the cycle's database writes stand,
and no other message is held back by it. Each message is signed as it is
produced (`publish`, shared/contract/signing.py) when the scorer has a key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from shared.contract.models_health import AlertOpened, AlertResolved, HealthVerdict
from shared.contract.signing import Signer
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.kafka import JsonProducer

log = logging.getLogger(__name__)

ScorerMessage = HealthVerdict | AlertOpened | AlertResolved
TopicKind = Literal["health", "alerts"]
Message = tuple[TopicKind, str, ScorerMessage]  # (topic kind, key, message)


def _built(kind: TopicKind, model: type[ScorerMessage], fields: dict[str, Any]) -> Message | None:
    try:
        return kind, fields["gpu_uuid"], model.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        log.warning(
            "%s message refused by its contract, not published: %s: %s",
            kind,
            where,
            first["msg"],
            extra={"gpu_uuid": str(fields["gpu_uuid"])[:128]},
        )
        return None


def verdict_changed(
    *,
    as_of: datetime,
    gpu_uuid: str,
    hostname: str | None,
    subsystem: str,
    state: str,
    previous: str | None,
    rule: str | None,
    action: str,
    evidence: dict[str, Any],
) -> Message | None:
    """The gpu-health message of one subsystem's new verdict."""
    return _built(
        "health",
        HealthVerdict,
        {
            "time": as_of,
            "gpu_uuid": gpu_uuid,
            "hostname": hostname or "",
            "subsystem": subsystem,
            "state": state,
            "previous": previous,
            "rule": rule,
            "action": action,
            "evidence": evidence,
        },
    )


def alert_opened(
    *,
    as_of: datetime,
    alert_id: int,
    gpu_uuid: str,
    kind: str,
    severity: str,
    summary: str,
    evidence: dict[str, Any],
) -> Message | None:
    """The gpu-alerts message of an alert just opened (its hostname comes from the inventory)."""
    return _built(
        "alerts",
        AlertOpened,
        {
            "time": as_of,
            "alert_id": alert_id,
            "gpu_uuid": gpu_uuid,
            "hostname": "",
            "kind": kind,
            "severity": severity,
            "state": "open",
            "summary": summary,
            "evidence": evidence,
        },
    )


def alert_resolved(*, as_of: datetime, alert_id: int, gpu_uuid: str, kind: str) -> Message | None:
    """The gpu-alerts message of an alert whose evidence is gone."""
    return _built(
        "alerts",
        AlertResolved,
        {
            "time": as_of,
            "alert_id": alert_id,
            "gpu_uuid": gpu_uuid,
            "hostname": "",
            "kind": kind,
            "state": "resolved",
        },
    )


def named(messages: Iterable[Message], hostnames: Mapping[str, str]) -> list[Message]:
    """The messages, each without a hostname given its GPU's from `hostnames` ("" if unknown)."""
    out: list[Message] = []
    for kind, key, message in messages:
        if message.hostname:
            out.append((kind, key, message))
            continue
        fields = {**dict(message), "hostname": hostnames.get(key, "")}
        if (renamed := _built(kind, type(message), fields)) is not None:
            out.append(renamed)
    return out


def publish(
    producer: JsonProducer, signer: Signer | None, topics: Mapping[str, str], messages: Iterable[Message]
) -> None:
    """Queue the messages on their topics, each signed for its topic and key (unsigned without a signer)."""
    for kind, _, message in messages:
        key, value = TopicSettings.entry(kind).encode(message)
        topic = topics[kind]
        headers = signer.headers(topic, key, value) if signer is not None else None
        producer.produce(topic, key, value, headers=headers)
    producer.poll(0)

"""What the remediator believes: a signed message, fresh, about a GPU it knows, on the host it knows.

Before anything is decided, a verdict (gpu-health) or alert (gpu-alerts) must

1. carry the scorer's signature over its topic, key and canonical value, by a
   key in the keyring (shared/contract/signing.py): else `unsigned`,
   `unknown_key`, `bad_signature`, or `invalid` when its value is not a
   message of the topic;
2. be neither older than `max_age_s` nor further ahead than `max_future_s`,
   judged on its own time field: else `stale` or `future` (a signed verdict
   replayed later is stale; replayed at once, its decision key finds the
   decision already taken);
3. name a GPU the inventory (gpu_assets) or the node map knows, and, when it
   names a host, the host they place it on: else `unknown_gpu` or
   `wrong_host`. The node acted on is theirs, never the message's alone.

The third check reads the database, so it is made only for a message that
calls for an action (most verdicts say a GPU is healthy again: nothing to
decide). A refused message makes no decision and no plan; it is counted
(`gpuhealth_remediator_refused_total{reason}`), logged (the detail, never the
signature) and recorded as a `refusal` record naming its topic, partition and
offset.

Training jobs' alerts (source `training`, gpuhealth.training) are published by
the jobs themselves, unsigned: the remediator reads them and never acts on
one (the policy cannot list them), so an unsigned training alert is no refusal,
only counted as `unauthenticated`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import confluent_kafka

from shared.contract.signing import Keyring, SigningSettings, Verified
from shared.plumbing.errors import ConfigError
from shared.store import remediation as store
from shared.store.remediation import SyncConn

from .findings import Finding, NodeMap
from .record import event

log = logging.getLogger(__name__)

Reason = Literal[
    "unsigned", "unknown_key", "bad_signature", "invalid", "stale", "future", "unknown_gpu", "wrong_host"
]
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is not believed: a reason (the metric's label) and a detail without secrets."""

    reason: Reason
    detail: str
    gpu_uuid: str | None = None


class Trust:
    """The keyring and the time bounds the remediator checks every message against."""

    def __init__(self, keyring: Keyring, *, max_age_s: float, max_future_s: float) -> None:
        self.keyring = keyring
        self.max_age = timedelta(seconds=max_age_s)
        self.max_future = timedelta(seconds=max_future_s)

    @classmethod
    def from_settings(cls, settings: SigningSettings) -> Trust:
        """The trust `settings` describe; ConfigError without a keyring (the remediator would believe
        nothing, or, worse, everything)."""
        if settings.trusted_keys_file is None:
            raise ConfigError(
                "GPUHEALTH_REMEDIATOR__SIGNING__TRUSTED_KEYS_FILE is needed: the remediator acts only on"
                " verdicts and alerts signed by a key it trusts (docs/services/remediator.md, Safety)"
            )
        keyring = Keyring.load(settings.trusted_keys_file)
        return cls(keyring, max_age_s=settings.max_age_s, max_future_s=settings.max_future_s)

    def verify(self, message: confluent_kafka.Message) -> Verified:
        """The message's value when its signature holds for its topic and key; UntrustedError says why not."""
        return self.keyring.verify(
            topic=str(message.topic()),
            key=message.key(),
            value=message.value(),
            headers=message.headers(),
        )

    def timely(self, at: datetime, now: datetime) -> Refusal | None:
        """None when `at` (the message's own time) is within the bounds of `now`."""
        if at < now - self.max_age:
            return Refusal("stale", f"its time {at:%Y-%m-%dT%H:%M:%SZ} is more than {self._age} old")
        if at > now + self.max_future:
            return Refusal("future", f"its time {at:%Y-%m-%dT%H:%M:%SZ} is ahead of the clock")
        return None

    @property
    def _age(self) -> str:
        return f"{self.max_age.total_seconds():g} s"


def placed(conn: SyncConn, finding: Finding, nodes: NodeMap) -> Finding | Refusal:
    """The finding on the node the inventory or the node map places its GPU on; a Refusal when neither
    knows the GPU, or the message names another host than the inventory's (the node map's for a GPU the
    inventory does not hold)."""
    inventory = store.gpu_hostname(conn, finding.gpu_uuid)
    mapped = nodes.gpus.get(finding.gpu_uuid)
    known = inventory if inventory is not None else mapped
    if known is None:
        return Refusal("unknown_gpu", "neither the inventory nor the node map holds it", finding.gpu_uuid)
    if finding.hostname and finding.hostname != known:
        return Refusal(
            "wrong_host",
            f"the message places it on {finding.hostname[:64]!r}, the inventory on {known!r}",
            finding.gpu_uuid,
        )
    return replace(finding, hostname=mapped or known)


def refusal_record(
    refusal: Refusal, message: confluent_kafka.Message, *, kid: str | None, at: datetime, dry_run: bool
) -> dict[str, Any]:
    """The `refusal` record of a message: where it was read and why it was refused; never its signature,
    and no node (the message's host is not believed)."""
    where: dict[str, Any] = {
        "topic": str(message.topic()),
        "partition": message.partition(),
        "offset": message.offset(),
        "reason": refusal.reason,
    }
    if kid is not None:
        where["kid"] = kid
    return event(
        "refusal",
        at=at,
        status="refused",
        dry_run=dry_run,
        gpu_uuid=refusal.gpu_uuid,
        reason=_printable(f"{refusal.reason}: {refusal.detail}"),
        response=where,
    )


def _printable(text: str) -> str:
    """A detail as a record can hold it: a hostile message's text may carry NULs or lone surrogates, which
    no database row can, and a refusal that cannot be written would be read again for ever."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\x00")

"""The project's topics, in one table: each topic's name, messages, JSON Schema, key and retention.

:class:`TopicSettings` is that table. Each field is one topic: its setting
(``GPUHEALTH_TOPICS__<FIELD>`` names it), its default name, the line under it
saying what it carries, and its :class:`Topic`: the message model(s) with
their committed JSON Schema under ``schema/json/``, what the Kafka key is,
how long it is kept and its cleanup policy, its partitions, and which of the
sink's loops stores it. Everything else reads this table: topic creation
(``python -m shared.plumbing.topic_admin``, shared/plumbing/topic_admin.py), the JSON Schemas
(``python -m shared.contract.topic_registry`` writes them; a unit test fails when one
is stale or a topic has none), the sink's subscriptions, and the tests.

Adding a topic is one field here and its model; see
tests/unit/shared/test_topic_registry.py, which adds one to a registry of its
own and watches creation, schemas and settings follow. A service that
produces or consumes it reads its name as ``settings.topics.<field>``.

Renamed: the dead letters' topic was ``gpu-metrics-dlq`` (setting
``GPUHEALTH_TOPICS__DLQ``); it carries dead letters from every topic the sink
reads, so it is ``gpu-dead-letters`` (``GPUHEALTH_TOPICS__DEAD_LETTERS``).
The old setting still works and warns at start; how to move a deployment is
in docs/operating.md (Dead letters). The header names (``dlq.*``) are the
headers' contract and stay as they are.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import JsonSchemaMode

from gpuhealth.contract.training import TrainingAlert
from shared.contract.models import GpuEvent, GpuSample
from shared.contract.models_deadletter import DeadLetterHeaders
from shared.contract.models_health import AlertOpened, AlertResolved, HealthVerdict
from shared.contract.models_lifecycle import LifecycleDecision
from shared.contract.models_remediation import RemediationRecord
from shared.contract.models_verify import SystemIdentity, VerificationRecord
from shared.contract.models_workload import GpuProcesses, LlmServerStatus, LlmSession

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema" / "json"
# A Kafka topic name: what the broker accepts (legal characters, at most 249 of them).
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TopicName = Annotated[str, Field(pattern=TOPIC_NAME_PATTERN)]
# The key of a topic whose records keep the key they had where they came from (the dead letters').
ORIGINAL_KEY = "(the key of the record it carries)"


class Keep(StrEnum):
    """How long a topic keeps its records (its retention.ms)."""

    RAW = "raw"  # GPUHEALTH_TOPICS__RETENTION_MS: re-readable for a while; the database keeps them after
    AUDIT = "audit"  # GPUHEALTH_TOPICS__AUDIT_RETENTION_MS: small, and the trail of what was decided
    FOREVER = "forever"  # never deleted, by time or by size: an audit log (retention.ms and .bytes -1)


# The Kafka principals, one per service, and `admin` (topic set-up, the tests' and operators' tools; a
# super user, with `broker`). Each topic below names which may write and which may read it;
# shared/plumbing/topic_admin.py
# turns that into the broker's ACLs (the StandardAuthorizer refuses everything else).
Principal = Literal[
    "collector", "sink", "scorer", "remediator", "verifier", "lifecycle", "llm-monitor", "api"
]
PRINCIPALS: tuple[str, ...] = (*get_args(Principal), "admin")
# The consumer groups each principal may join (group ids starting with these): the services' default group
# ids. A service whose group id is configured otherwise needs a grant for it (docs/operating.md, Security).
CONSUMER_GROUPS: dict[str, tuple[str, ...]] = {
    "collector": ("gpu-health-spool-check-",),
    "sink": ("gpu-health-sink",),
    "scorer": ("gpuhealth-scorer",),
    "remediator": ("gpu-health-remediator",),
    "verifier": ("gpu-health-audit-",),
}

# The sink's loops (services/sink): SinkLoop (metrics), VerificationLoop and WorkloadLoop.
SinkLoopName = Literal["metrics", "verification", "workload"]


@dataclass(frozen=True, slots=True)
class Message:
    """One kind of message a topic carries: its model and its committed JSON Schema file."""

    model: type[BaseModel]
    schema: str  # the file under schema/json/
    part: Literal["value", "headers"] = "value"  # what of the Kafka record the model describes
    # the side of the model the schema describes: "serialization" where the bytes on the wire are
    # the model's own output (the chained records, whose hash covers them)
    mode: JsonSchemaMode = "validation"


@dataclass(frozen=True, slots=True, init=False)
class Topic:
    """A topic's entry, beside its setting in TopicSettings (which holds its default name)."""

    messages: tuple[Message, ...]
    key: str  # the field of each message whose value is the Kafka key, or ORIGINAL_KEY
    keep: Keep
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"
    # None: GPUHEALTH_TOPICS__PARTITIONS. Every topic so far is keyed by a GPU or a host, so all grow
    # with the fleet alike.
    partitions: int | None = None
    stored_by: SinkLoopName | None = None  # the sink loop that stores it; None: the sink does not read it
    writers: tuple[Principal, ...] = ()  # the principals that may write it (the ACLs; admin may anything)
    readers: tuple[Principal, ...] = ()  # the principals that may read it

    def __init__(
        self,
        *messages: Message,
        key: str,
        keep: Keep,
        writers: tuple[Principal, ...],
        readers: tuple[Principal, ...] = (),
        cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete",
        partitions: int | None = None,
        stored_by: SinkLoopName | None = None,
    ) -> None:
        if not messages:
            raise TypeError("a topic carries at least one kind of message")
        if not writers:
            raise TypeError("a topic has at least one writer")
        if stored_by is not None and "sink" not in readers:
            raise TypeError("the sink reads the topics it stores")
        for name, value in (
            ("messages", messages), ("key", key), ("keep", keep), ("cleanup_policy", cleanup_policy),
            ("partitions", partitions), ("stored_by", stored_by), ("writers", writers), ("readers", readers),
        ):  # fmt: skip
            object.__setattr__(self, name, value)


class Registered(NamedTuple):
    """A topic as the table has it: its setting, default name, what it carries, and its entry."""

    setting: str
    default: str
    carries: str
    topic: Topic


class TopicSettings(BaseModel):
    """Topic names (one field per topic: the topics' table) and how `python -m shared.plumbing.topic_admin`
    creates them."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    metrics_raw: Annotated[
        TopicName,
        Topic(
            Message(GpuSample, "gpu-sample.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.RAW,
            stored_by="metrics",
            writers=("collector",),
            readers=("sink", "collector"),
        ),
    ] = "gpu-metrics-raw"
    """One sample per GPU per poll, every metric its source reported."""
    events: Annotated[
        TopicName,
        Topic(
            Message(GpuEvent, "gpu-event.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.AUDIT,
            stored_by="metrics",
            writers=("collector",),
            readers=("sink", "scorer", "collector"),
        ),
    ] = "gpu-events"
    """What happened between two polls: XIDs, ECC DBE increments, throttling, GPUs lost and back."""
    health: Annotated[
        TopicName,
        Topic(
            Message(HealthVerdict, "gpu-health.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.AUDIT,
            writers=("scorer",),
            readers=("remediator",),
        ),
    ] = "gpu-health"
    """The scorer's health verdicts, one message per change of a GPU subsystem's state."""
    alerts: Annotated[
        TopicName,
        Topic(
            Message(AlertOpened, "gpu-alert-opened.v1.schema.json"),
            Message(AlertResolved, "gpu-alert-resolved.v1.schema.json"),
            Message(TrainingAlert, "gpu-alert-training.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.AUDIT,
            writers=("scorer",),
            readers=("remediator",),
        ),
    ] = "gpu-alerts"
    """Alerts opened and resolved, by the scorer and by training jobs (told apart by `source`)."""
    dead_letters: Annotated[
        TopicName,
        Topic(
            Message(DeadLetterHeaders, "gpu-dead-letter-headers.v1.schema.json", part="headers"),
            key=ORIGINAL_KEY,
            keep=Keep.AUDIT,
            writers=("sink",),
            readers=("sink",),
        ),
    ] = "gpu-dead-letters"
    """Records the sink refused, from every topic it reads: the record's own bytes, headers saying why."""
    processes: Annotated[
        TopicName,
        Topic(
            Message(GpuProcesses, "gpu-processes.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.RAW,
            stored_by="workload",
            writers=("collector",),
            readers=("sink", "collector"),
        ),
    ] = "gpu-processes"
    """Each GPU's processes at a poll, each classified (training, inference, ...)."""
    llm_sessions: Annotated[
        TopicName,
        Topic(
            Message(LlmSession, "llm-session.v1.schema.json"),
            Message(LlmServerStatus, "llm-server-status.v1.schema.json"),
            key="server",
            keep=Keep.RAW,
            stored_by="workload",
            writers=("llm-monitor",),
            readers=("sink", "llm-monitor"),
        ),
    ] = "llm-sessions"
    """LLM requests as the proxy saw them, and each LLM server's status at a poll."""
    verifications: Annotated[
        TopicName,
        Topic(
            Message(VerificationRecord, "gpu-verification.v1.schema.json", mode="serialization"),
            key="gpu_uuid",
            keep=Keep.FOREVER,
            stored_by="verification",
            writers=("verifier",),
            readers=("sink", "verifier"),
        ),
    ] = "gpu-verifications"
    """Compute checks and logged operations, chained per GPU by SHA-256: an audit log, kept for ever."""
    systems: Annotated[
        TopicName,
        Topic(
            Message(SystemIdentity, "gpu-system.v1.schema.json", mode="serialization"),
            key="hostname",
            keep=Keep.AUDIT,
            stored_by="verification",
            writers=("collector",),
            readers=("sink", "collector"),
        ),
    ] = "gpu-systems"
    """Each node's hardware and driver identity, at collector start and on change."""
    lifecycle: Annotated[
        TopicName,
        Topic(
            Message(LifecycleDecision, "gpu-lifecycle.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.AUDIT,
            writers=("lifecycle",),
        ),
    ] = "gpu-lifecycle"
    """Each GPU's lifecycle decision at each run (keep, reset, RMA or repair, repurpose, retire), priced."""
    remediations: Annotated[
        TopicName,
        Topic(
            Message(RemediationRecord, "gpu-remediation.v1.schema.json"),
            key="gpu_uuid",
            keep=Keep.AUDIT,
            writers=("remediator",),
        ),
    ] = "gpu-remediations"
    """The remediator's decisions, actions, outcomes and validations (keyed by GPU, else node, else fleet)."""

    # How every topic is created.
    partitions: int = Field(default=6, ge=1, le=10_000)
    """Partitions per topic, unless its entry sets its own; a topic with fewer is grown (never shrunk)."""
    replication_factor: int = Field(default=1, ge=1, le=10)
    """Replicas of each topic's partitions, when it is created."""
    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=60_000)
    """Retention of the `Keep.RAW` topics (samples, processes, LLM sessions; 7 days)."""
    audit_retention_ms: int = Field(default=30 * 24 * 3600 * 1000, ge=60_000)
    """Retention of the `Keep.AUDIT` topics (events, verdicts, alerts, dead letters, identities; 30 days)."""
    acls: bool = True
    """Apply each topic's ACLs (who writes, who reads) at set-up; the broker must run an authorizer. Only
    `false` for a broker that has none (a test's throwaway broker): then anyone can write anything."""

    dlq: str | None = Field(
        default=None, pattern=TOPIC_NAME_PATTERN, deprecated="the dead letters' topic is `dead_letters` now"
    )
    """Deprecated (warns at start): the old name of `GPUHEALTH_TOPICS__DEAD_LETTERS`, taken as that."""

    @model_validator(mode="after")
    def _renamed(self) -> Self:
        """GPUHEALTH_TOPICS__DLQ still names the dead letters' topic (how to move: docs/operating.md)."""
        old = self.__dict__["dlq"]  # read past the deprecation, which warns on every read
        if old is not None:
            if "dead_letters" in self.model_fields_set:
                raise ValueError("both GPUHEALTH_TOPICS__DLQ (deprecated) and __DEAD_LETTERS are set")
            log.warning(
                "GPUHEALTH_TOPICS__DLQ is deprecated: set GPUHEALTH_TOPICS__DEAD_LETTERS instead "
                "(its default name is now gpu-dead-letters)"
            )
            self.dead_letters = old
        return self

    @classmethod
    def registry(cls) -> tuple[Registered, ...]:
        """The topics of this table, in its order (a subclass adds its own after)."""
        out = []
        for setting, field in cls.model_fields.items():
            entries = [m for m in field.metadata if isinstance(m, Topic)]
            if not entries:
                continue
            if len(entries) > 1 or not isinstance(field.default, str) or not field.description:
                raise TypeError(f"topic {setting}: one Topic, a default name and a line on what it carries")
            out.append(Registered(setting, field.default, field.description, entries[0]))
        return tuple(out)

    def stored_by(self, loop: SinkLoopName) -> list[str]:
        """The configured names of the topics that sink loop stores (it subscribes to these)."""
        return [getattr(self, r.setting) for r in self.registry() if r.topic.stored_by == loop]


def json_schemas(table: type[TopicSettings] = TopicSettings) -> dict[str, dict[str, Any]]:
    """The JSON Schema of every message of every topic, by its file name under schema/json/."""
    schemas: dict[str, dict[str, Any]] = {}
    for registered in table.registry():
        for message in registered.topic.messages:
            if message.schema in schemas:
                raise ValueError(f"{message.schema} is named by two messages")
            schemas[message.schema] = message.model.model_json_schema(mode=message.mode)
    return schemas


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as the committed files have it."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_json_schemas(schemas: dict[str, dict[str, Any]], directory: Path = SCHEMA_DIR) -> list[str]:
    """Write each schema under `directory` and remove the ones no topic has any more; what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, schema in schemas.items():
        path = directory / name
        if not path.exists() or path.read_text() != schema_text(schema):
            path.write_text(schema_text(schema))
            changed.append(f"wrote {name}")
    for stale in sorted(directory.glob("*.schema.json")):
        if stale.name not in schemas:
            stale.unlink()
            changed.append(f"removed {stale.name}")
    return changed


def main() -> int:
    """Write the JSON Schemas of every topic under schema/json/ (commit the result)."""
    for line in write_json_schemas(json_schemas()) or ["schema/json/ is up to date"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

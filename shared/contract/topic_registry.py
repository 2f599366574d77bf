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
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuhealth.contract.training import TrainingAlert
from shared.contract.models import GpuEvent, GpuSample, parse_event, parse_sample
from shared.contract.models_deadletter import DeadLetterHeaders
from shared.contract.models_health import (
    AlertOpened,
    AlertResolved,
    HealthVerdict,
    parse_alert,
    parse_health_verdict,
)
from shared.contract.models_lifecycle import LifecycleDecision, parse_lifecycle_decision
from shared.contract.models_remediation import RemediationRecord, parse_remediation
from shared.contract.models_verify import SystemIdentity, VerificationRecord, parse_system, parse_verification
from shared.contract.models_workload import (
    GpuProcesses,
    LlmServerStatus,
    LlmSession,
    parse_gpu_processes,
    parse_llm_message,
)

# A topic's entry (shared/contract/topic_entry.py), named here too: the table's vocabulary.
from shared.contract.topic_entry import (
    GPU_KEY as GPU_KEY,
)
from shared.contract.topic_entry import (
    ORIGINAL_KEY as ORIGINAL_KEY,
)
from shared.contract.topic_entry import (
    PRINCIPALS as PRINCIPALS,
)
from shared.contract.topic_entry import (
    Encoded as Encoded,
)
from shared.contract.topic_entry import (
    Keep as Keep,
)
from shared.contract.topic_entry import (
    Key as Key,
)
from shared.contract.topic_entry import (
    KeyMismatchError as KeyMismatchError,
)
from shared.contract.topic_entry import (
    Message as Message,
)
from shared.contract.topic_entry import (
    Principal as Principal,
)
from shared.contract.topic_entry import (
    SinkLoopName as SinkLoopName,
)
from shared.contract.topic_entry import (
    Topic as Topic,
)

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema" / "json"
# A Kafka topic name: what the broker accepts (legal characters, at most 249 of them).
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TopicName = Annotated[str, Field(pattern=TOPIC_NAME_PATTERN)]


# The consumer groups each principal may join (group ids starting with these): the services' default group
# ids. A service whose group id is configured otherwise needs a grant for it (docs/operating.md, Security).
CONSUMER_GROUPS: dict[str, tuple[str, ...]] = {
    "collector": ("gpu-health-spool-check-",),
    "sink": ("gpu-health-sink",),
    "scorer": ("gpuhealth-scorer",),
    "remediator": ("gpu-health-remediator",),
    "verifier": ("gpu-health-audit-",),
}

# The topics' settings (the fields of TopicSettings below; a unit test keeps the two the same).
TopicField = Literal[
    "metrics_raw",
    "events",
    "health",
    "alerts",
    "dead_letters",
    "processes",
    "llm_sessions",
    "verifications",
    "systems",
    "lifecycle",
    "remediations",
]


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
            key=GPU_KEY,
            decoder=parse_sample,
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
            key=GPU_KEY,
            decoder=parse_event,
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
            key=GPU_KEY,
            decoder=parse_health_verdict,
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
            key=GPU_KEY,
            decoder=parse_alert,
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
            key=GPU_KEY,
            decoder=parse_gpu_processes,
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
            key=Key(("server",), says="server name"),
            decoder=parse_llm_message,
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
            key=Key(("gpu_uuid",), required=True, says="GPU UUID"),
            decoder=parse_verification,
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
            key=Key(("hostname",), required=True, says="hostname"),
            decoder=parse_system,
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
            key=GPU_KEY,
            decoder=parse_lifecycle_decision,
            keep=Keep.AUDIT,
            writers=("lifecycle",),
        ),
    ] = "gpu-lifecycle"
    """Each GPU's lifecycle decision at each run (keep, reset, RMA or repair, repurpose, retire), priced."""
    remediations: Annotated[
        TopicName,
        Topic(
            Message(RemediationRecord, "gpu-remediation.v1.schema.json"),
            # A record is about a GPU, else a node (a drain, a reboot), else the whole fleet (a paused
            # plan): nothing reads this topic back and it is not compacted, so the key only keeps one
            # GPU's (or node's) records in order on one partition. The producer's key was right and
            # this entry said gpu_uuid alone: the entry now says what is on the wire.
            key=Key(
                ("gpu_uuid", "node"), fallback="fleet", says="GPU UUID (else the node's, else the fleet's)"
            ),
            decoder=parse_remediation,
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

    @classmethod
    def entry(cls, setting: TopicField) -> Topic:
        """The entry of one topic of this table, by its setting (``"lifecycle"``, ...)."""
        for registered in cls.registry():
            if registered.setting == setting:
                return registered.topic
        raise KeyError(f"no topic {setting!r} in {cls.__name__}")

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

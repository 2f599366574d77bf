"""A topic's entry in the registry (shared/contract/topic_registry.py): what it owns at run time.

:class:`Topic` holds a topic's messages (:class:`Message`, model and committed JSON Schema), its
:class:`Key`, retention, ACLs and the sink loop that stores it, and it is the one way to produce and
consume it: ``entry.encode(message)`` is the key and value a producer sends (a model that is not
the topic's is a TypeError), ``entry.decode(raw)`` the model a consumer reads, and
``entry.check_key(raw_key, message)`` the one check of a record's key (:class:`KeyMismatchError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NamedTuple, TypeVar, get_args

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from gpuhealth.contract.base import parse_message
from gpuhealth.errors import ContractError


@dataclass(frozen=True, slots=True)
class Key:
    """What a topic's Kafka key is: the first of `fields` a message has set, else `fallback`.

    The key decides a record's partition, so it is what keeps one GPU's (or host's) records in order;
    consumers refuse a record whose key is not its message's. `required`: a record without a key is
    refused too (the chained topics, whose order is per key). No fields: the records keep the key
    they had where they came from (the dead letters').
    """

    fields: tuple[str, ...]
    fallback: str | None = None
    required: bool = False
    says: str = ""  # how the docs say it (docs/operating.md's topic table)

    def of(self, message: object) -> str:
        """The key of `message` (a model, or a mapping of its fields)."""
        if not self.fields:
            raise TypeError("these records keep the key of the record they carry; there is none to make")
        for name in self.fields:
            value = message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)
            if value:
                return str(value)
        if self.fallback is None:
            raise ContractError(f"the message has no {' or '.join(self.fields)} to be keyed by")
        return self.fallback

    @property
    def field(self) -> str:
        """The one field a key is (for readers of rows instead of models)."""
        if len(self.fields) != 1 or self.fallback is not None:
            raise TypeError(f"a key of {self.fields} (else {self.fallback!r}) is not one field")
        return self.fields[0]


# The key of a topic whose records keep the key they had where they came from (the dead letters').
ORIGINAL_KEY = Key((), says="original key")
GPU_KEY = Key(("gpu_uuid",), says="GPU UUID")


class KeyMismatchError(ContractError):
    """A record whose Kafka key is not its message's: it would sit on another GPU's partition."""


class Encoded(NamedTuple):
    """A message as a producer sends it: its key and its JSON-ready value."""

    key: str
    value: dict[str, Any]


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


Decoder = Callable[[bytes | str], BaseModel]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True, init=False)
class Topic:
    """A topic's entry, beside its setting in TopicSettings (which holds its default name).

    It owns the topic at run time: every producer sends through :meth:`encode` (the key and the value
    of a message of this topic; any other model is a TypeError), every consumer reads through
    :meth:`decode` and checks the key with :meth:`check_key`.
    """

    messages: tuple[Message, ...]
    key: Key
    keep: Keep
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"
    # None: GPUHEALTH_TOPICS__PARTITIONS. Every topic so far is keyed by a GPU or a host, so all grow
    # with the fleet alike.
    partitions: int | None = None
    stored_by: SinkLoopName | None = None  # the sink loop that stores it; None: the sink does not read it
    writers: tuple[Principal, ...] = ()  # the principals that may write it (the ACLs; admin may anything)
    readers: tuple[Principal, ...] = ()  # the principals that may read it
    decoder: Decoder | None = None  # bytes to one of its models (ContractError says why not)

    def __init__(
        self,
        *messages: Message,
        key: Key,
        keep: Keep,
        writers: tuple[Principal, ...],
        readers: tuple[Principal, ...] = (),
        cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete",
        partitions: int | None = None,
        stored_by: SinkLoopName | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        if not messages:
            raise TypeError("a topic carries at least one kind of message")
        if not writers:
            raise TypeError("a topic has at least one writer")
        if stored_by is not None and "sink" not in readers:
            raise TypeError("the sink reads the topics it stores")
        values = [m.model for m in messages if m.part == "value"]
        if decoder is None and len(values) == 1:
            decoder = _parser(values[0])
        fields = {
            "messages": messages,
            "key": key,
            "keep": keep,
            "cleanup_policy": cleanup_policy,
            "partitions": partitions,
            "stored_by": stored_by,
            "writers": writers,
            "readers": readers,
            "decoder": decoder,
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @property
    def models(self) -> tuple[type[BaseModel], ...]:
        """The models of the records' values (a topic whose model describes headers has none)."""
        return tuple(m.model for m in self.messages if m.part == "value")

    def key_of(self, message: BaseModel) -> str:
        """The Kafka key of one of this topic's messages; TypeError for a model it does not carry."""
        if not isinstance(message, self.models) or not self.models:
            names = [m.__name__ for m in self.models]
            raise TypeError(f"a {type(message).__name__} is not a message of this topic (it carries {names})")
        return self.key.of(message)

    def encode(self, message: BaseModel) -> Encoded:
        """What a producer sends: the message's key, and its value JSON-ready (nulls kept)."""
        return Encoded(self.key_of(message), message.model_dump(mode="json"))

    def decode(self, raw: bytes | str) -> BaseModel:
        """One record's value as its model; ContractError says why it is refused."""
        if self.decoder is None:
            raise TypeError("this topic's records are not decoded by a model of their value")
        return self.decoder(raw)

    def read(self, model: type[M], raw: bytes | str) -> M:
        """One record's value decoded as `model`, which must be one of this topic's models (TypeError
        otherwise: a consumer cannot read a topic as what it does not carry); ContractError says why
        the record is refused."""
        if model not in self.models:
            names = [m.__name__ for m in self.models]
            raise TypeError(f"this topic carries {names}, not {model.__name__}")
        message = self.decode(raw)
        if not isinstance(message, model):
            raise ContractError(f"a {type(message).__name__} where a {model.__name__} was expected")
        return message

    def key_matches(self, raw: bytes | None, key: str) -> bool:
        """Whether a record's key is `key`, its message's; no key passes unless the topic requires one."""
        return raw == key.encode() if raw is not None or self.key.required else True

    def check_key(self, raw: bytes | None, message: BaseModel | str) -> None:
        """KeyMismatchError unless a record's key is its message's (or the key read from its row, a str)."""
        if not self.key_matches(raw, message if isinstance(message, str) else self.key.of(message)):
            raise KeyMismatchError(f"message key does not match {' or '.join(self.key.fields)}")


def _parser(model: type[BaseModel]) -> Decoder:
    def parse(raw: bytes | str) -> BaseModel:
        return parse_message(model, raw)

    return parse

"""The project's exception tree: one root, one subclass per area."""

from __future__ import annotations

# The root and the errors the users' library raises too live in the library, which the services build on.
from gpuhealth.errors import ConfigError as ConfigError
from gpuhealth.errors import ContractError as ContractError
from gpuhealth.errors import GpuHealthError as GpuHealthError


class KafkaError(GpuHealthError):
    """A Kafka operation failed; `retriable` says whether trying again can help."""

    def __init__(self, message: str, *, code: str | None = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable


class KafkaUnavailableError(KafkaError):
    """The brokers could not be reached in time."""


class KafkaProduceError(KafkaError):
    """A message could not be handed to, or was rejected by, the broker."""


class KafkaTopicError(KafkaError):
    """A topic could not be created or described."""


class DatabaseError(GpuHealthError):
    """A database operation failed."""


class DatabaseUnavailableError(DatabaseError):
    """The database could not be reached in time."""


class DataRefusedError(DatabaseError):
    """The database (or the driver, before sending) refused the values themselves: retrying cannot help."""


class MigrationError(DatabaseError):
    """A schema migration is malformed, failed, or was edited after it was applied."""

"""The project's exception tree: one root, one subclass per area."""

from __future__ import annotations

# The root and the errors the users' library raises too live in the library, which the services build on.
from gpuhealth.errors import ConfigError as ConfigError
from gpuhealth.errors import ContractError as ContractError
from gpuhealth.errors import GpuHealthError as GpuHealthError
from gpuhealth.errors import KafkaError as KafkaError
from gpuhealth.errors import KafkaProduceError as KafkaProduceError
from gpuhealth.errors import KafkaUnavailableError as KafkaUnavailableError


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

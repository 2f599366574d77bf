"""The root of gpu-health's exceptions, and those the library raises too (settings, contract, Kafka).

The services' exception tree (shared.plumbing.errors) grows from this root, so one
`except GpuHealthError` catches what either the library or the services raise.
"""

from __future__ import annotations


class GpuHealthError(Exception):
    """Root of every error gpu-health raises on purpose."""


class ConfigError(GpuHealthError):
    """Settings are missing or invalid."""


class ContractError(GpuHealthError):
    """A message or value breaks the project's data contract."""


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

"""The root of gpu-health's exceptions, and the two that the library raises too.

The services' exception tree (shared.errors) grows from this root, so one
`except GpuHealthError` catches what either the library or the services raise.
"""

from __future__ import annotations


class GpuHealthError(Exception):
    """Root of every error gpu-health raises on purpose."""


class ConfigError(GpuHealthError):
    """Settings are missing or invalid."""


class ContractError(GpuHealthError):
    """A message or value breaks the project's data contract."""

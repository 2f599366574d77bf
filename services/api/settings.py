"""GPUHEALTH_API__* and GPUHEALTH_AUTH__*: where the API listens, how it reaches the database, who may
call it, and its limits."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from shared.plumbing.errors import ConfigError
from shared.settings.common import HEALTH_RULES_FILE, Section, Settings

from .auth import AuthSection

# The scorer's rules (shared.settings.common.HEALTH_RULES_FILE unless moved): the API counts a GPU as
# missing by the rules' own threshold, so the summary and the verdicts never disagree.
RULES_FILE = HEALTH_RULES_FILE


def missing_after_s(rules_file: Path) -> int:
    """The rules' [availability] missing_after_s: seconds without a sample after which a GPU is missing."""
    try:
        with rules_file.open("rb") as f:
            value = tomllib.load(f)["availability"]["missing_after_s"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{rules_file}: no [availability] missing_after_s ({e})") from e
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{rules_file}: [availability] missing_after_s must be a positive integer")
    return value


class ApiSection(Section):
    """GPUHEALTH_API__*: where the API listens, its logins, the hosts it answers to, and its limits."""

    bind: str = "127.0.0.1"
    """Address the API listens on."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port the API listens on."""
    reader_user: str = "gpuhealth_reader"
    """The read-only login every query runs as."""
    reader_password: SecretStr = SecretStr("gpuhealth_reader")
    """The read-only login's password."""
    acknowledger_user: str = "gpuhealth_acknowledger"
    """The only login that may write (acknowledge, approve, mark repaired); used after the caller's role
    was checked."""
    acknowledger_password: SecretStr = SecretStr("gpuhealth_acknowledger")
    """The acknowledging login's password."""
    tls_cert_file: Path | None = None
    """The API's TLS certificate chain (PEM): set with `tls_key_file`, the API speaks HTTPS only. Unset:
    plain HTTP, for loopback or behind an ingress that terminates TLS (docs/operating.md, Security)."""
    tls_key_file: Path | None = None
    """The private key (PEM) of `tls_cert_file`."""
    trusted_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1", "localhost", "[::1]"])
    """The `Host` names the API answers to (a DNS name pointed at it by someone else is refused, 400);
    `*.example.com` covers subdomains. Add the name clients use behind an ingress."""
    pool_size: int = Field(default=10, ge=1, le=100)
    """Database connections held for queries."""
    max_range_days: int = Field(default=31, ge=1, le=3650)
    """The longest time range a query may span."""
    max_points: int = Field(default=5000, ge=10, le=100_000)
    """The most points of a series; a bucket too fine for the range is widened to the finest that fits."""
    max_body_bytes: int = Field(default=65_536, ge=1024, le=64 * 1024 * 1024)
    """A request body larger than this is refused (413) before it is read."""
    max_header_bytes: int = Field(default=16_384, ge=1024, le=1024 * 1024)
    """The largest request head."""
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """The headers must arrive within this of the connection (or of the previous answer), else 408 and
    the connection closes."""
    body_timeout_s: float = Field(default=20.0, gt=0, le=600)
    """A body must arrive within this of its headers, else 408 and the connection closes."""
    max_connections: int = Field(default=1000, ge=1, le=100_000)
    """Connections served at once."""
    cache_max_age_s: float = Field(default=30.0, ge=0, le=3600)
    """The fleet summary and the GPU list are cached until the scorer's next cycle, and fresh for at most
    this (0: no cache). The scorer's default cycle is 30 s."""
    cache_max_stale_s: float = Field(default=10.0, ge=0, le=3600)
    """Once a cycle is announced (or `cache_max_age_s` passes), a cached answer is served stale for at
    most this long while it is read again in the background; past it, or with nothing cached, a request
    waits for the new answer (0: always wait). The default is about three times the fleet summary's query
    at 100,000 GPUs (3 s), so a refresh lands before it runs out, and a third of the scorer's cycle, so
    the answers lag the scorer by little next to the cycle itself. Answers say their `Age`."""
    rules_file: Path = RULES_FILE
    """The health rules the scorer judges by: the summary's `missing` uses their availability threshold.
    Where `GPUHEALTH_SCORER__RULES_FILE` moves the scorer's, set this to the same file."""

    @field_validator("rules_file")
    @classmethod
    def _rules_file(cls, value: Path) -> Path:
        try:
            missing_after_s(value)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSection:
        """A certificate without its key, or a key without its certificate, is a mistake, not plain HTTP."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self


class ApiSettings(Settings):
    api: ApiSection = Field(default_factory=ApiSection)
    auth: AuthSection = Field(default_factory=AuthSection)

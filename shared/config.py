"""Settings for every service: pydantic-settings, env prefix GPUHEALTH_, nested with `__`.

Example: ``GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS=10.0.0.5:9092``. Secrets are
``SecretStr`` and print as ``**********``. Services subclass :class:`Settings`
to add their own section and build it inside ``main()``, never at import time,
so a bad variable is a clear error at start rather than an import failure.
The defaults match the native stack that ``make services`` starts
(scripts/env.sh).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import ConfigError

log = logging.getLogger(__name__)

S = TypeVar("S", bound="Settings")

# The health rules (thresholds and windows) the scorer judges by, and by which the API counts a GPU
# missing: one default for both (each service may point at another file through its settings).
HEALTH_RULES_FILE = Path(__file__).resolve().parents[1] / "config" / "health-rules.toml"


class KafkaSettings(BaseModel):
    """How to reach the brokers."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "gpu-health"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # Extra librdkafka properties, e.g. {"ssl.ca.location": "/etc/ca.pem"}.
    extra: dict[str, str] = Field(default_factory=dict)


class TopicSettings(BaseModel):
    """Topic names (configuration, DESIGN.md defaults) and how they are created."""

    metrics_raw: str = "gpu-metrics-raw"
    events: str = "gpu-events"
    health: str = "gpu-health"
    alerts: str = "gpu-alerts"
    dlq: str = "gpu-metrics-dlq"
    processes: str = "gpu-processes"
    llm_sessions: str = "llm-sessions"
    # compute checks and logged operations, chained per GPU: kept forever (retention.ms=-1)
    verifications: str = "gpu-verifications"
    systems: str = "gpu-systems"  # each node's identity, at collector start and on change
    partitions: int = Field(default=6, ge=1, le=10_000)
    replication_factor: int = Field(default=1, ge=1, le=10)
    # Raw samples are re-readable for a week; the database is the long-term store.
    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=60_000)
    # Verdicts and alerts are small and are the audit trail: kept for 30 days.
    audit_retention_ms: int = Field(default=30 * 24 * 3600 * 1000, ge=60_000)


class DatabaseSettings(BaseModel):
    """How to reach TimescaleDB."""

    host: str = "127.0.0.1"
    port: int = Field(default=55432, ge=1, le=65535)
    name: str = "gpu_health"
    user: str = "gpuhealth"
    password: SecretStr = SecretStr("gpuhealth")
    sslmode: str = "prefer"
    connect_timeout_s: int = Field(default=5, ge=1, le=300)
    application_name: str = "gpu-health"
    # A schema to use before `public` (where TimescaleDB lives): isolates tests and tenants.
    search_path: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_]{0,62}$")

    def conninfo(self, **overrides: Any) -> str:
        """A libpq connection string; values are quoted so no setting can inject another."""
        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "dbname": self.name,
            "user": self.user,
            "password": self.password.get_secret_value(),
            "sslmode": self.sslmode,
            "connect_timeout": self.connect_timeout_s,
            "application_name": self.application_name,
        }
        if self.search_path:
            params["options"] = f"-c search_path={self.search_path},public"
        params.update(overrides)
        return " ".join(f"{key}={_libpq_quote(str(value))}" for key, value in params.items())


def _libpq_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class LogSettings(BaseModel):
    """Logging: JSON lines by default, plain text for people at a terminal."""

    level: str = "INFO"
    json_format: bool = Field(default=True, alias="json")


class Settings(BaseSettings):
    """Settings every service has; services extend it with their own section."""

    model_config = SettingsConfigDict(
        env_prefix="GPUHEALTH_",
        env_nested_delimiter="__",
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)
    log: LogSettings = Field(default_factory=LogSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment, turning validation errors into a ConfigError."""
    try:
        return cls(**overrides)
    except ValidationError as e:
        problems = "; ".join(
            f"GPUHEALTH_{'__'.join(str(p).upper() for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from e


def masked(settings: BaseModel) -> dict[str, Any]:
    """The settings as a dict fit for a log line: secrets stay `**********`."""
    return settings.model_dump(mode="json")


def log_settings(settings: BaseModel, service: str) -> None:
    """Log the effective configuration once at start, secrets masked."""
    log.info("%s starting", service, extra={"settings": masked(settings)})

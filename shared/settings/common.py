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
import re
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from gpuhealth.kafka_settings import KafkaSettings as KafkaSettings  # shared with the training library

# every topic's name: the topics' table is shared/contract/topic_registry.py
from shared.contract.topic_registry import TopicSettings as TopicSettings
from shared.plumbing.errors import ConfigError
from shared.plumbing.secrets import masked as mask_settings

log = logging.getLogger(__name__)

S = TypeVar("S", bound="Settings")

# The health rules (thresholds and windows) the scorer judges by, and by which the API counts a GPU
# missing: one default for both (each service may point at another file through its settings).
HEALTH_RULES_FILE = Path(__file__).resolve().parents[2] / "config" / "health-rules.toml"


class Section(BaseModel):
    """A section of the settings: each field's docstring is its description in the configuration reference."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class DatabaseSettings(Section):
    """How to reach TimescaleDB."""

    host: str = "127.0.0.1"
    """Host name or address (or a Unix socket's folder)."""
    port: int = Field(default=55432, ge=1, le=65535)
    """Port (the native stack's is not 5432, so it never meets a system PostgreSQL)."""
    name: str = "gpu_health"
    """Database name."""
    user: str = "gpuhealth"
    """Login: the tables' owner for the writing services."""
    password: SecretStr = SecretStr("gpuhealth")
    """The login's password."""
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    """libpq's `sslmode`. With `sslrootcert` set it is `verify-full` unless set otherwise, and only
    `verify-ca` or `verify-full` may go with a CA: the server's certificate and name are checked."""
    sslrootcert: str | None = None
    """The CA (PEM file) the server's certificate must chain to (`make up`: the local CA,
    `$GPUHEALTH_RUN/tls/ca.pem`, and PostgreSQL serves TLS with its certificate)."""
    connect_timeout_s: int = Field(default=5, ge=1, le=300)
    """How long one connection attempt may take."""
    application_name: str = "gpu-health"
    """Shown in `pg_stat_activity` and the server's log; a service started as itself names its own,
    `gpu-health-<service>` (`gpu-health-scorer`...), unless this is set."""
    search_path: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    """The one schema a service reaches (tests, tenants); unset: the role's default (`public`). A bound
    service sees no table of any other schema, `public` included: a table missing from its schema is an
    error, never a read or write elsewhere. TimescaleDB's functions are called as `public.*`."""

    @model_validator(mode="after")
    def _verify_where_tls_is_configured(self) -> Self:
        """A CA means TLS is configured: then the server is verified, name and all (verify-full)."""
        if self.sslrootcert:
            if "sslmode" not in self.model_fields_set:
                self.sslmode = "verify-full"
            elif self.sslmode not in ("verify-ca", "verify-full"):
                raise ValueError(f"sslmode {self.sslmode} with an sslrootcert: the CA would not be checked")
        return self

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
        if self.sslrootcert:
            params["sslrootcert"] = self.sslrootcert
        if self.search_path:
            params["options"] = f"-c search_path={self.search_path}"
        params.update(overrides)
        return " ".join(f"{key}={_libpq_quote(str(value))}" for key, value in params.items())


def _libpq_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ShutdownSettings(Section):
    """Between SIGTERM (or SIGINT) and a service's exit: one deadline, kept whatever the database does."""

    timeout_s: float = Field(default=20.0, ge=2, le=600)
    """The longest a service takes from SIGTERM to its exit. For its first quarter the work in hand is
    finished; then a database statement still running is cancelled (another session holds a lock it
    waits on); from half of it a connection still waiting on the server is cut and no new one is opened
    (a server or network that stopped answering); at the deadline the process logs every thread's stack
    and exits 1. A connection attempt already under way at SIGTERM may take its whole
    `GPUHEALTH_DB__CONNECT_TIMEOUT_S`: keep that under half of this. Keep this under the orchestrator's
    kill: Kubernetes' `terminationGracePeriodSeconds` (30 s by default), systemd's `TimeoutStopSec`
    (90 s), `docker stop`'s 10 s (compose gives these services `stop_grace_period: 30s`)."""


class LogSettings(Section):
    """Logging: JSON lines by default, plain text for people at a terminal."""

    level: str = "INFO"
    """`DEBUG`, `INFO`, `WARNING` or `ERROR`."""
    json_format: bool = Field(default=True, alias="json")
    """JSON lines (`true`) or plain text (`false`)."""


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
    shutdown: ShutdownSettings = Field(default_factory=ShutdownSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment, turning validation errors into a ConfigError."""
    try:
        return cls(**overrides)
    except ValidationError as e:
        problems = "; ".join(
            f"GPUHEALTH_{'__'.join(str(p).upper() for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from e
    except SettingsError as e:  # a list or object that is not JSON: say which section, not a traceback
        field = re.search(r'field "(\w+)"', str(e))
        where = f"GPUHEALTH_{field[1].upper()}__*" if field else "a GPUHEALTH_* variable"
        problem = f"a list or object that is not JSON ({e.__cause__})"
        raise ConfigError(f"invalid settings: {where}: {problem}") from e


def masked(settings: BaseModel) -> dict[str, Any]:
    """The settings as a dict fit for a log line: secrets stay `**********`, also inside mappings
    (`GPUHEALTH_KAFKA__EXTRA`'s `sasl.password`) and URLs' user info (shared/plumbing/secrets.py)."""
    return mask_settings(settings)


def log_settings(settings: BaseModel, service: str) -> None:
    """Log the effective configuration once at start, secrets masked."""
    log.info("%s starting", service, extra={"settings": masked(settings)})

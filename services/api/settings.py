"""GPUHEALTH_API__*: where the API listens, how it reaches the database, its secrets and its limits."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from shared.config import Settings


class ApiSection(BaseModel):
    bind: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    reader_user: str = "gpuhealth_reader"
    reader_password: SecretStr = SecretStr("gpuhealth_reader")
    # The only login that may acknowledge (migration 0012); used after the API key was checked.
    acknowledger_user: str = "gpuhealth_acknowledger"
    acknowledger_password: SecretStr = SecretStr("gpuhealth_acknowledger")
    # Acknowledging an alert needs this in X-API-Key; unset, acknowledging is refused (403).
    api_key: SecretStr | None = None
    pool_size: int = Field(default=10, ge=1, le=100)
    max_range_days: int = Field(default=31, ge=1, le=3650)
    max_points: int = Field(default=5000, ge=10, le=100_000)
    # Hostile clients: a body larger than this is refused (413) before it is read; the
    # headers must arrive within header_timeout_s of the connection (or of the previous
    # answer), a body within body_timeout_s of its headers, else 408 and the connection closes.
    max_body_bytes: int = Field(default=65_536, ge=1024, le=64 * 1024 * 1024)
    max_header_bytes: int = Field(default=16_384, ge=1024, le=1024 * 1024)
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    body_timeout_s: float = Field(default=20.0, gt=0, le=600)
    max_connections: int = Field(default=1000, ge=1, le=100_000)
    shutdown_timeout_s: int = Field(default=10, ge=1, le=600)
    # The fleet summary and the GPU list are cached until the scorer's next cycle (cache.py),
    # and never longer than this (0: no cache). The scorer's default cycle is 30 s.
    cache_max_age_s: float = Field(default=30.0, ge=0, le=3600)


class ApiSettings(Settings):
    api: ApiSection = Field(default_factory=ApiSection)

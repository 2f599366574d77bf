"""GPUHEALTH_API__*: where the API listens, how it reaches the database, its one secret."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from shared.config import Settings


class ApiSection(BaseModel):
    bind: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    reader_user: str = "gpuhealth_reader"
    reader_password: SecretStr = SecretStr("gpuhealth_reader")
    # Acknowledging an alert needs this in X-API-Key; unset, acknowledging is refused (403).
    api_key: SecretStr | None = None
    pool_size: int = Field(default=10, ge=1, le=100)
    max_range_days: int = Field(default=31, ge=1, le=3650)
    max_points: int = Field(default=5000, ge=10, le=100_000)


class ApiSettings(Settings):
    api: ApiSection = Field(default_factory=ApiSection)

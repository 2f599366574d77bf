"""The API's service: JWT callers without an issuer to verify them by is a setting at fault (exit 2)."""

from __future__ import annotations

import pytest

from services.api.build import ApiService
from services.api.settings import ApiSettings
from shared.plumbing.errors import ConfigError


def test_jwt_without_an_issuer_is_refused_naming_both_settings() -> None:
    with pytest.raises(ConfigError, match="GPUHEALTH_AUTH__JWKS_URL or GPUHEALTH_AUTH__JWKS_FILE"):
        ApiService(ApiSettings())

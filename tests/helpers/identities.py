"""Callers for the API's tests: the local mode's issuer (services.api.local_tokens) in a temporary folder.

`local_identities(dir)` writes a signing key, its JWKS and a token per role, and says how the API
should verify them (`auth`) and which `Host` names the tests use (`TEST_HOSTS`). `issue` makes
any other token with the same key (expired, another audience, no role...).
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from services.api.app import create_app
from services.api.auth import AuthSection
from services.api.local_tokens import issue, signing_key, write_local
from services.api.settings import ApiSection
from shared.settings.common import DatabaseSettings

# TestClient's host, the loopback names, and the raw-socket tests' `Host: test`
TEST_HOSTS = ["testserver", "127.0.0.1", "localhost", "test"]


@dataclass(frozen=True)
class LocalIdentities:
    directory: Path
    auth: AuthSection
    tokens: dict[str, str]  # by role

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def token_file(self, role: str) -> Path:
        return self.directory / f"{role}.token"

    def issue(self, subject: str, role: str, **claims: Any) -> str:
        """A token of this issuer's key for `subject` (claims override the local mode's)."""
        return issue(signing_key(self.directory), subject, role, **claims)


def local_identities(directory: Path, **auth: Any) -> LocalIdentities:
    files = write_local(directory)
    settings = AuthSection(jwks_file=directory / "jwks.json", **auth)
    return LocalIdentities(
        directory, settings, {role: path.read_text().strip() for role, path in files.items()}
    )


def api_section(**fields: Any) -> ApiSection:
    """ApiSection for a test: the test hosts trusted, `fields` as given."""
    return ApiSection(**{"trusted_hosts": TEST_HOSTS, **fields})


@functools.cache
def identities() -> LocalIdentities:
    """The test session's issuer: one key and one token per role, in a temporary folder."""
    return local_identities(Path(tempfile.mkdtemp(prefix="gpuhealth-auth-")))


def as_role(role: str) -> dict[str, str]:
    """The `Authorization` header of the session's `role` token."""
    return identities().headers(role)


def api_app(db: DatabaseSettings, api: ApiSection | None = None, **kwargs: Any) -> FastAPI:
    """create_app for a test: the test hosts trusted (beside `api`'s fields), the session's issuer."""
    fields = api.model_dump() if api is not None else {}
    return create_app(
        db, api_section(**{**fields, "trusted_hosts": TEST_HOSTS}), auth=identities().auth, **kwargs
    )


class As:
    """httpx.get/post with a role's token (headers given are added)."""

    def __init__(self, role: str) -> None:
        self.role = role

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(url, headers={**as_role(self.role), **kwargs.pop("headers", {})}, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(url, headers={**as_role(self.role), **kwargs.pop("headers", {})}, **kwargs)


VIEWER, OPERATOR, ADMIN = As("viewer"), As("operator"), As("admin")


def token_args(role: str) -> list[str]:
    """The `gpuhealth` CLI's arguments for the session's `role` token (a file: never the token itself)."""
    return ["--token-file", str(identities().token_file(role))]


def api_env() -> dict[str, str]:
    """The environment `python -m services.api` needs to know the session's callers, and the test hosts."""
    return {"GPUHEALTH_AUTH__JWKS_FILE": str(identities().auth.jwks_file),
            "GPUHEALTH_API__TRUSTED_HOSTS": json.dumps(TEST_HOSTS)}  # fmt: skip

"""With the database gone, every data endpoint answers 503 with a clear message, never 500."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from fastapi.testclient import TestClient
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from services.api.deps import attach, state_of
from services.api.settings import ApiSection
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def data_endpoints(openapi: dict[str, Any]) -> list[str]:
    """Every GET under /api/v1 but the reference data (code, not database), its path parameters filled
    with a value of the type the document gives them."""

    def filled(path: str, get: dict[str, Any]) -> str:
        types = {
            p["name"]: p.get("schema", {}).get("type") for p in get.get("parameters", []) if p["in"] == "path"
        }

        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            if types.get(name) == "integer":
                return "1"
            return UUID if "uuid" in name else "node-0"

        return re.sub(r"\{([^}]+)\}", value, path)

    paths: list[str] = [
        filled(str(path), ops["get"])
        for path, ops in openapi["paths"].items()
        if "get" in ops and str(path).startswith("/api/v1") and not str(path).startswith("/api/v1/reference")
    ]
    return sorted(paths)


def test_every_data_endpoint_answers_503_when_the_database_is_away(migrated: DatabaseSettings) -> None:
    with TestClient(
        headers=as_role("viewer"), app=api_app(migrated, ApiSection(cache_max_age_s=0))
    ) as client:
        paths = data_endpoints(client.get("/openapi.json").json())
        assert len(paths) >= 15, paths
        # the pool now points at a port nothing listens on: each checkout fails after its timeout
        dead = AsyncConnectionPool(
            "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1", min_size=0, max_size=1,
            open=False, kwargs={"row_factory": dict_row, "autocommit": True}, timeout=0.5,
        )  # fmt: skip
        client.portal.call(dead.open)  # type: ignore[union-attr]
        state = state_of(client.app)  # type: ignore[arg-type]
        attach(client.app, replace(state, db=replace(state.db, pool=dead)))  # type: ignore[arg-type]
        answers = {path: client.get(path) for path in paths}
        wrong = {p: (r.status_code, r.text[:120]) for p, r in answers.items() if r.status_code != 503}
        assert not wrong, wrong
        assert all(r.json() == {"detail": "the database is not reachable"} for r in answers.values())
        assert client.get("/healthz").status_code == 200
        client.portal.call(dead.close)  # type: ignore[union-attr]

"""The app's areas: each router of ROUTERS is routed, the operations area answers without a database, and
the error table turns a refusal into its status and `detail`."""

from __future__ import annotations

import asyncio
import json

from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient

from services.api import operations
from services.api.app import ERRORS, ROUTERS, create_app
from services.api.settings import ApiSection
from shared.plumbing.errors import DatabaseUnavailableError
from shared.settings.common import DatabaseSettings


def test_the_areas_are_routed_in_the_order_of_routers() -> None:
    paths = list(create_app(DatabaseSettings(), ApiSection()).openapi()["paths"])
    assert ROUTERS[0] is operations.router
    assert (
        paths[:3]
        == [getattr(route, "path", None) for route in operations.router.routes]
        == ["/healthz", "/readyz", "/metrics"]
    )
    assert paths[3:]
    assert all(path.startswith("/api/v1/") for path in paths[3:])


def test_the_operations_area_answers_without_a_database() -> None:
    app = create_app(DatabaseSettings(port=9), ApiSection())
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/healthz").text == "ok\n"
        assert client.get("/readyz").status_code == 503
        assert 'gpuhealth_api_requests_total{route="/readyz",status="503"} 1.0' in client.get("/metrics").text


def test_the_error_table_answers_a_bad_request_422_and_a_database_down_503() -> None:
    errors = [{"type": "missing", "loc": ("query", "limit"), "msg": "Field required"}]
    bad = asyncio.run(ERRORS[RequestValidationError](None, RequestValidationError(errors)))  # type: ignore[arg-type]
    assert (bad.status_code, json.loads(bytes(bad.body))) == (422, {"detail": "query.limit: Field required"})
    down = asyncio.run(ERRORS[DatabaseUnavailableError](None, DatabaseUnavailableError("gone")))  # type: ignore[arg-type]
    assert (down.status_code, json.loads(bytes(down.body))) == (
        503,
        {"detail": "the database is not reachable"},
    )

"""The FastAPI app factory: pools for the read-only and the acknowledging logins, health, metrics, errors.

Every answer to a bad request is a 4xx with a message in `detail`; a database
that is down is a 503, never a stack trace. Around it, outermost first: the security
headers every answer carries (services.api.headers), the trusted-host check (a `Host` not in
`trusted_hosts` is a 400: no DNS rebinding), and :class:`services.api.guard.RequestGuard`:
body limit, methods, the caller's token and role, and body deadline before the application
reads or parses anything.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from starlette.middleware.trustedhost import TrustedHostMiddleware

from shared.plumbing.errors import DatabaseUnavailableError
from shared.settings.common import DatabaseSettings
from shared.store import fleet

from .answers import NotReady, Ready
from .auth import Authenticator, AuthSection
from .cache import CacheMetrics, CycleCache
from .deps import ApiState, Database, Db, attach
from .guard import RequestGuard
from .headers import SecurityHeaders
from .routes import router
from .settings import ApiSection, missing_after_s
from .web import add_web

log = logging.getLogger(__name__)


def reader_settings(db: DatabaseSettings, api: ApiSection) -> DatabaseSettings:
    """The owner's address and schema with the read-only role's credentials."""
    return db.model_copy(update={"user": api.reader_user, "password": api.reader_password,
                                 "application_name": "gpu-health-api"})  # fmt: skip


def acknowledger_settings(db: DatabaseSettings, api: ApiSection) -> DatabaseSettings:
    """The owner's address and schema with the acknowledging login (the only one that may acknowledge)."""
    return db.model_copy(update={"user": api.acknowledger_user, "password": api.acknowledger_password,
                                 "application_name": "gpu-health-api-ack"})  # fmt: skip


def create_app(
    db: DatabaseSettings,
    api: ApiSection,
    registry: CollectorRegistry | None = None,
    auth: AuthSection | None = None,
) -> FastAPI:
    """The app; `auth` says how callers are known (default: GPUHEALTH_AUTH__*'s defaults, which know none)."""
    registry = registry or CollectorRegistry()
    requests = Counter("gpuhealth_api_requests", "Requests", ["route", "status"], registry=registry)
    refusals = Counter(
        "gpuhealth_api_auth_refusals",
        "Requests refused for who sent them, by reason:"
        " missing, invalid, expired, no_role, forbidden, throttled, unavailable",
        ["reason"],
        registry=registry,
    )
    authenticator = Authenticator(auth or AuthSection(), on_refusal=lambda why: refusals.labels(why).inc())
    latency = Histogram("gpuhealth_api_request_seconds", "Request latency", ["route"], registry=registry)
    pool = AsyncConnectionPool(
        reader_settings(db, api).conninfo(), min_size=1, max_size=api.pool_size, open=False,
        kwargs={"row_factory": dict_row, "autocommit": True}, timeout=10,
    )  # fmt: skip
    # Used only by the acknowledge endpoint, after the key was checked: a reader cannot acknowledge.
    ack_pool = AsyncConnectionPool(
        acknowledger_settings(db, api).conninfo(), min_size=0, max_size=2, open=False,
        kwargs={"row_factory": dict_row, "autocommit": True}, timeout=10,
    )  # fmt: skip

    cache = CycleCache(reader_settings(db, api).conninfo(), max_age_s=api.cache_max_age_s,
                       max_stale_s=api.cache_max_stale_s)  # fmt: skip
    registry.register(CacheMetrics(cache))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=False)
        await ack_pool.open(wait=False)
        cache.start()
        yield
        await authenticator.close()
        await cache.close()
        await ack_pool.close()
        await pool.close()

    app = FastAPI(
        title="gpu-health",
        version="1",
        description="Which GPUs are healthy, which are failing, and what to do about it.",
        lifespan=lifespan,
        docs_url=None,  # served by .web from the swagger-ui-bundle package, not a CDN
        redoc_url=None,
    )
    attach(app, ApiState(db=Database(pool=pool, ack_pool=ack_pool), cache=cache, settings=api,
                         authenticator=authenticator,
                         missing_after_s=missing_after_s(api.rules_file)))  # fmt: skip
    app.add_middleware(
        RequestGuard,
        authenticator=authenticator,
        routes=lambda: app.routes,
        max_body_bytes=api.max_body_bytes,
        body_timeout_s=api.body_timeout_s,
        on_refusal=lambda status: requests.labels("refused", str(status)).inc(),
    )

    @app.middleware("http")
    async def measure(request: Request, call_next):  # type: ignore[no-untyped-def]
        route = request.scope.get("route")
        with latency.labels(getattr(route, "path", "other")).time():
            response: Response = await call_next(request)
        route = request.scope.get("route")
        requests.labels(getattr(route, "path", "other"), str(response.status_code)).inc()
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        def said(err: dict[str, Any]) -> str:
            if err["type"] == "unknown_query_parameter":  # names itself (services.api.parameters)
                return str(err["msg"])
            return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"

        return JSONResponse(status_code=422, content={"detail": "; ".join(said(err) for err in e.errors())})

    @app.exception_handler(DatabaseUnavailableError)
    async def db_down(_: Request, e: Exception) -> JSONResponse:
        log.error("database unavailable: %s", e)
        return JSONResponse(status_code=503, content={"detail": "the database is not reachable"})

    text = {"schema": {"type": "string"}}

    @app.get("/healthz", tags=["operations"], response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": text}}})  # fmt: skip
    async def healthz() -> PlainTextResponse:
        """The process serves (liveness); says nothing of the database."""
        return PlainTextResponse("ok\n")

    @app.get("/readyz", tags=["operations"], response_model=Ready, responses={503: {"model": NotReady}})
    async def readyz(db: Db) -> JSONResponse:
        """The database answers (readiness): 503 with the reason while it does not."""
        try:
            async with db.pool.connection(timeout=3) as conn:
                await fleet.reachable(conn)
        except Exception as e:
            return JSONResponse(status_code=503, content={"ready": False, "detail": str(e)[:200]})
        return JSONResponse({"ready": True})

    @app.get("/metrics", tags=["operations"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: text},
                              "description": "Prometheus' text format"}})  # fmt: skip
    async def metrics() -> Response:
        """The API's own metrics: requests by route and status, latency by route, the cache's answers."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(TrustedHostMiddleware, allowed_hosts=api.trusted_hosts, www_redirect=False)
    app.add_middleware(SecurityHeaders)
    app.include_router(router)
    add_web(app)
    return app

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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from starlette.middleware.trustedhost import TrustedHostMiddleware

from shared.plumbing.errors import DatabaseUnavailableError
from shared.settings.common import DatabaseSettings

from . import operations
from .auth import Authenticator, AuthSection
from .cache import CacheMetrics, CycleCache
from .deps import ApiState, Database, attach, state_of
from .guard import RequestGuard
from .headers import SecurityHeaders
from .routes import router
from .settings import ApiSection, missing_after_s
from .web import add_web

log = logging.getLogger(__name__)


def reader_settings(db: DatabaseSettings, api: ApiSection) -> DatabaseSettings:
    """The owner's address and schema with the read-only role's credentials."""
    login = {"user": api.reader_user, "password": api.reader_password, "application_name": "gpu-health-api"}
    return db.model_copy(update=login)


def acknowledger_settings(db: DatabaseSettings, api: ApiSection) -> DatabaseSettings:
    """The owner's address and schema with the acknowledging login (the only one that may acknowledge)."""
    login = {"user": api.acknowledger_user, "password": api.acknowledger_password}
    return db.model_copy(update={**login, "application_name": "gpu-health-api-ack"})


def pool(settings: DatabaseSettings, *, min_size: int, max_size: int) -> AsyncConnectionPool:
    """A pool of one login, opened by the app's lifespan; rows as dicts, every statement its own commit."""
    kwargs = {"row_factory": dict_row, "autocommit": True}
    return AsyncConnectionPool(
        settings.conninfo(), min_size=min_size, max_size=max_size, open=False, kwargs=kwargs, timeout=10
    )


@dataclass(frozen=True, slots=True)
class ApiMetrics:
    """The API's own: requests by route and status, refusals of callers by reason, latency by route."""

    requests: Counter
    refusals: Counter
    latency: Histogram

    @classmethod
    def on(cls, registry: CollectorRegistry) -> ApiMetrics:
        requests = Counter("gpuhealth_api_requests", "Requests", ["route", "status"], registry=registry)
        refusals = Counter(
            "gpuhealth_api_auth_refusals",
            "Requests refused for who sent them, by reason:"
            " missing, invalid, expired, no_role, forbidden, throttled, unavailable",
            ["reason"],
            registry=registry,
        )
        latency = Histogram("gpuhealth_api_request_seconds", "Request latency", ["route"], registry=registry)
        return cls(requests, refusals, latency)

    def measure(self) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
        """The middleware that counts and times each request by its route."""

        async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            route = request.scope.get("route")
            with self.latency.labels(getattr(route, "path", "other")).time():
                response: Response = await call_next(request)
            route = request.scope.get("route")
            self.requests.labels(getattr(route, "path", "other"), str(response.status_code)).inc()
            return response

        return measure


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The pools open and the cache starts with the app; they close, with the authenticator, after it."""
    state = state_of(app)
    await state.db.pool.open(wait=False)
    await state.db.ack_pool.open(wait=False)
    state.cache.start()
    yield
    await state.authenticator.close()
    await state.cache.close()
    await state.db.ack_pool.close()
    await state.db.pool.close()


async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
    """A request that does not validate: 422, every error in one `detail`."""

    def said(err: dict[str, Any]) -> str:
        if err["type"] == "unknown_query_parameter":  # names itself (services.api.parameters)
            return str(err["msg"])
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"

    return JSONResponse(status_code=422, content={"detail": "; ".join(said(err) for err in e.errors())})


async def db_down(_: Request, e: Exception) -> JSONResponse:
    log.error("database unavailable: %s", e)
    return JSONResponse(status_code=503, content={"detail": "the database is not reachable"})


ERRORS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    RequestValidationError: invalid,
    DatabaseUnavailableError: db_down,
}
# The areas of the app, in the order they are routed (the web page's, with its static files, comes last).
ROUTERS = (operations.router, router)


def create_app(
    db: DatabaseSettings,
    api: ApiSection,
    registry: CollectorRegistry | None = None,
    auth: AuthSection | None = None,
) -> FastAPI:
    """The app; `auth` says how callers are known (default: GPUHEALTH_AUTH__*'s defaults, which know none)."""
    registry = registry or CollectorRegistry()
    metrics = ApiMetrics.on(registry)
    authenticator = Authenticator(
        auth or AuthSection(), on_refusal=lambda why: metrics.refusals.labels(why).inc()
    )
    reader = reader_settings(db, api)
    cache = CycleCache(reader.conninfo(), max_age_s=api.cache_max_age_s, max_stale_s=api.cache_max_stale_s)
    registry.register(CacheMetrics(cache))
    app = FastAPI(
        title="gpu-health",
        version="1",
        description="Which GPUs are healthy, which are failing, and what to do about it.",
        lifespan=lifespan,
        docs_url=None,  # served by .web from the swagger-ui-bundle package, not a CDN
        redoc_url=None,
        exception_handlers=ERRORS,
    )
    # ack_pool: used only by the acknowledge endpoint, after the key was checked: a reader cannot acknowledge.
    pools = Database(
        pool=pool(reader, min_size=1, max_size=api.pool_size),
        ack_pool=pool(acknowledger_settings(db, api), min_size=0, max_size=2),
    )
    missing_after = missing_after_s(api.rules_file)
    attach(app, ApiState(pools, cache, api, authenticator, missing_after, registry))
    app.add_middleware(
        RequestGuard,
        authenticator=authenticator,
        routes=lambda: app.routes,
        max_body_bytes=api.max_body_bytes,
        body_timeout_s=api.body_timeout_s,
        on_refusal=lambda status: metrics.requests.labels("refused", str(status)).inc(),
    )
    app.middleware("http")(metrics.measure())
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=api.trusted_hosts, www_redirect=False)
    app.add_middleware(SecurityHeaders)
    for area in ROUTERS:
        app.include_router(area)
    add_web(app)
    return app

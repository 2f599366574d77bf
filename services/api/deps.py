"""What handlers take from the app, as `Annotated[..., Depends(...)]` aliases: database, cache, settings.

`create_app` keeps one :class:`ApiState` on the app; nothing else reads
`app.state`. `Db` hands out connections only when a handler asks (`async with
db.reading() as conn`), so a request is validated before it takes one, and a
cached answer takes none. A pool that cannot hand one out (the database is down)
is DatabaseUnavailableError, a 503. Every /api/v1 route needs a caller (`Caller`: the Identity
services.api.guard verified); a write asks for its role (`Operator`, `Admin`), then
`db.acknowledging()`: a connection of the one login that may write. The actor a write records is
the caller's subject, never a body field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from shared.plumbing.errors import DatabaseUnavailableError

from .auth import Authenticator, Identity, Role
from .cache import CycleCache
from .guard import IDENTITY
from .settings import ApiSection


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    """A connection of `pool`; DatabaseUnavailableError where the pool cannot hand one out (database down)."""
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as e:  # PoolTimeout, or a connection the pool found broken
        raise DatabaseUnavailableError(f"database connection lost: {e}") from e


@dataclass(frozen=True, slots=True)
class Database:
    """The API's two logins: the read-only one, and the one that may acknowledge (and do nothing else)."""

    pool: AsyncConnectionPool
    ack_pool: AsyncConnectionPool

    def reading(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        return connection(self.pool)

    def acknowledging(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        return connection(self.ack_pool)


@dataclass(frozen=True, slots=True)
class ApiState:
    """Everything the handlers share."""

    db: Database
    cache: CycleCache  # the fleet-wide answers, until the scorer's next cycle
    settings: ApiSection
    authenticator: Authenticator
    missing_after_s: float  # the scorer's rules: seconds without a sample after which a GPU is missing
    registry: CollectorRegistry  # the API's own metrics (/metrics)


def attach(app: FastAPI, state: ApiState) -> None:
    app.state.gpu_health = state


def state_of(app: FastAPI) -> ApiState:
    state: ApiState = app.state.gpu_health
    return state


def api_state(request: Request) -> ApiState:
    return state_of(request.app)


State = Annotated[ApiState, Depends(api_state)]


def database(state: State) -> Database:
    return state.db


def cycle_cache(state: State) -> CycleCache:
    return state.cache


def settings(state: State) -> ApiSection:
    return state.settings


# Declares the bearer scheme in the OpenAPI document; the token itself was checked by the guard.
BEARER = HTTPBearer(auto_error=False, description="a token of the configured issuer (GPUHEALTH_AUTH__*)")


def caller(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None
) -> Identity:
    """The caller services.api.guard verified; 401 where it let none through (never, on /api/v1)."""
    identity: Identity | None = request.scope.get(IDENTITY)
    if identity is None:
        raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    return identity


def role(needed: Role) -> Any:
    """A dependency: the caller, refused (403) unless their role is `needed` or above."""

    def check(request: Request, who: Annotated[Identity, Depends(caller)]) -> Identity:
        if not who.may(needed):
            api_state(request).authenticator.refused(
                request.client.host if request.client else "unknown", "forbidden"
            )
            raise HTTPException(403, f"this needs the {needed} role; {who.subject} is a {who.role}")
        return who

    return check


Caller = Annotated[Identity, Depends(caller)]
Operator = Annotated[Identity, Depends(role("operator"))]
Admin = Annotated[Identity, Depends(role("admin"))]
Db = Annotated[Database, Depends(database)]
Cache = Annotated[CycleCache, Depends(cycle_cache)]
Settings = Annotated[ApiSection, Depends(settings)]

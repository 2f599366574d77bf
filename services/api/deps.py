"""What handlers take from the app, as `Annotated[..., Depends(...)]` aliases: database, cache, settings.

`create_app` keeps one :class:`ApiState` on the app; nothing else reads
`app.state`. `Db` hands out connections only when a handler asks (`async with
db.reading() as conn`), so a request is validated before it takes one, and a
cached answer takes none. A pool that cannot hand one out (the database is down)
is DatabaseUnavailableError, a 503. Acknowledging needs `require_key` first, then
`db.acknowledging()`: a connection of the one login that may acknowledge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from shared.errors import DatabaseUnavailableError

from .cache import CycleCache
from .guard import key_refusal
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
    missing_after_s: float  # the scorer's rules: seconds without a sample after which a GPU is missing


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


def require_key(state: State, x_api_key: Annotated[str | None, Header(max_length=512)] = None) -> None:
    """Refuse a write without the configured X-API-Key (401), or any write when none is configured (403).

    services.api.guard checked the key already, on the headers alone, before the body was read;
    it is checked again here so a write never depends on the order of layers."""
    if refusal := key_refusal(state.settings.api_key, x_api_key):
        raise HTTPException(refusal.status, refusal.detail)


Db = Annotated[Database, Depends(database)]
Cache = Annotated[CycleCache, Depends(cycle_cache)]
Settings = Annotated[ApiSection, Depends(settings)]

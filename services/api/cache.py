"""Fleet-wide answers kept until the scorer's next cycle, and never longer than `max_age_s`.

The fleet summary and the GPU list read 10,000 GPUs' status at each request; the
status changes once per scoring cycle. The scorer announces each committed cycle
(pg_notify('gpuhealth_scored', schema), sent at its commit); this cache LISTENs
on its own connection and forgets everything when one arrives. An answer is
stored only if no cycle was announced while it was being computed, so it is
never older than the cycle it was read in. While the listening connection is
not up (not yet connected, lost), nothing is cached: an announcement could be
missed. `max_age_s` bounds an entry's age whatever happens (a scorer that
stopped announcing). The encoded JSON is kept, so a hit costs no database
round trip, no row conversion and no JSON encoding.

Requests that miss while the same answer is being computed wait for that one
computation instead of each starting their own: after every scoring cycle, 32
concurrent clients would otherwise run the fleet-wide query 32 times at once
(through a pool of 10 connections), and every one of them would wait for the
slowest (docs/performance.md, the API's tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

import psycopg
from pydantic import BaseModel

from shared.errors import DatabaseError
from shared.store.notify import listen_scored

log = logging.getLogger(__name__)


def encode(answer: BaseModel) -> bytes:
    """JSON exactly as FastAPI renders an answer a handler returns (pydantic's own encoder, by alias)."""
    return answer.__pydantic_serializer__.to_json(answer, by_alias=True)


class CycleCache:
    def __init__(self, conninfo: str, *, max_age_s: float, max_entries: int = 512) -> None:
        self.conninfo, self.max_age_s, self.max_entries = conninfo, max_age_s, max_entries
        self.generation = 0  # bumped by every announced cycle and every (re)connection
        self.listening = False
        self._entries: dict[Hashable, tuple[int, float, bytes]] = {}
        self._pending: dict[Hashable, tuple[int, asyncio.Future[bytes]]] = {}  # computing, by generation
        self._task: asyncio.Task[None] | None = None
        self.hits = self.misses = self.joined = 0

    @property
    def enabled(self) -> bool:
        return self.max_age_s > 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _forget(self) -> None:
        self.generation += 1
        self._entries.clear()
        self._pending.clear()

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    schema = await listen_scored(conn)
                    self._forget()  # what was cached before listening may have missed a cycle
                    self.listening = True
                    async for note in conn.notifies():
                        if note.payload == schema:
                            self._forget()
            except (DatabaseError, psycopg.Error, OSError) as e:  # psycopg's: connecting, the notifies stream
                log.info("not caching: the scorer's announcements cannot be heard (%s)", e)
            finally:
                self.listening = False
                self._forget()
            await asyncio.sleep(1.0)

    async def get_or_compute(self, key: Hashable, compute: Callable[[], Awaitable[BaseModel]]) -> bytes:
        """The encoded answer for `key`: cached if still in this cycle, else computed (and cached)."""
        now = time.monotonic()
        if self.listening:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == self.generation and now - entry[1] < self.max_age_s:
                self.hits += 1
                return entry[2]
            pending = self._pending.get(key)
            if pending is not None and pending[0] == self.generation:
                self.joined += 1
                return await asyncio.shield(pending[1])  # one client leaving does not cancel the others'
        self.misses += 1
        generation, listening = self.generation, self.listening
        computing = asyncio.ensure_future(_encoded(compute))
        computing.add_done_callback(_retrieved)
        if listening:
            self._pending[key] = (generation, computing)
        try:
            body = await asyncio.shield(computing)
        finally:
            if self._pending.get(key, (0, None))[1] is computing:
                del self._pending[key]
        if listening and self.listening and generation == self.generation:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (generation, now, body)
        return body


async def _encoded(compute: Callable[[], Awaitable[BaseModel]]) -> bytes:
    return encode(await compute())


def _retrieved(done: asyncio.Future[bytes]) -> None:
    """Its error is retrieved even when every request that waited on it has gone."""
    if not done.cancelled():
        done.exception()

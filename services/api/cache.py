"""Fleet-wide answers kept until the scorer's next cycle, then served stale for a bounded while they refresh.

The fleet summary and the GPU list read the whole fleet's status at each
request; the status changes once per scoring cycle. The scorer announces each
committed cycle (pg_notify('gpuhealth_scored', schema), sent at its commit);
this cache LISTENs on its own connection. While the listening connection is not
up (not yet connected, lost), nothing is cached: an announcement could be
missed. The encoded JSON is kept, so a hit costs no database round trip, no row
conversion and no JSON encoding.

An answer is fresh until a cycle is announced after its reading began, or until
it is `max_age_s` old (a scorer that stopped announcing). Then it is stale: for
`max_stale_s` more, a request is answered with it at once while one background
refresh per answer reads the new one (at most `REFRESHES_AT_ONCE` of them at a
time, so a cycle does not start one fleet-wide query per cached page at once).
Past `max_stale_s`, or with nothing cached, a request waits for a fresh answer.
With three scorers announcing every 10 s at 100,000 GPUs, waiting would put
the summary's 3 s query in front of the next request after each announcement
(docs/performance.md, the API's tail). A refresh that fails keeps the old
answer (until it is `max_stale_s` stale), is logged and counted, and is not
tried again for `REFRESH_RETRY_S`. After a reading that took t seconds, the
next refresh of that answer starts no sooner than t seconds after it ended,
unless waiting would risk `max_stale_s` (stale for s seconds, it starts once
s + 2t reaches `max_stale_s`): a scorer that commits in chunks announces many
times a cycle, and back-to-back refreshes would keep the fleet-wide query
running without pause.

Requests that wait while the same answer is being computed wait for that one
computation instead of each starting their own (single flight): after every
scoring cycle, 32 concurrent clients would otherwise run the fleet-wide query
32 times at once, through a pool of 10 connections.

Each answer says how old it is (`Age`, seconds since its reading began) and
what the cache did (`Cache-Status`, RFC 9211; a negative `ttl` is how long it
has been stale).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel

from shared.plumbing.errors import DatabaseError
from shared.store.notify import listen_scored

log = logging.getLogger(__name__)

Compute = Callable[[], Awaitable[BaseModel]]  # reads an answer from the database

# Background refreshes reading at once: the pool holds 10 connections (ApiSection.pool_size) and the
# requests that are not cached (a GPU's detail, series, alerts) need theirs meanwhile.
REFRESHES_AT_ONCE = 2
# After a refresh failed, requests keep the stale answer this long before one tries again, so a
# database that refuses the query is not asked once per request.
REFRESH_RETRY_S = 1.0
CACHE_NAME = "gpu-health"  # how Cache-Status names this cache


def encode(answer: BaseModel) -> bytes:
    """JSON exactly as FastAPI renders an answer a handler returns (pydantic's own encoder, by alias)."""
    return answer.__pydantic_serializer__.to_json(answer, by_alias=True)


@dataclass(frozen=True, slots=True)
class Served:
    """An encoded answer and how fresh it is, as a client is told (`Age`, `Cache-Status`)."""

    body: bytes
    age_s: float
    """Seconds since its reading began (0: read for this request)."""
    status: str
    """What the cache did: `hit` (fresh), `stale` (served stale while it refreshes), `joined`
    (waited for a reading another request started), `computed` (read for this request and kept),
    `bypass` (read for this request alone: no cache, or the announcements are not heard)."""
    stale_s: float | None = None
    """Seconds since it was superseded (a cycle announced after its reading began, or `max_age_s`)."""

    def headers(self) -> dict[str, str]:
        """`Age` (RFC 9111, whole seconds) and `Cache-Status` (RFC 9211)."""
        said = {
            "hit": "hit",
            "stale": "hit",
            "joined": "fwd=miss; collapsed",
            "computed": "fwd=miss; stored",
            "bypass": "fwd=bypass",
        }[self.status]
        if self.stale_s is not None:
            said += f"; ttl={-math.ceil(self.stale_s)}"  # RFC 9211: a negative ttl is a stale answer
        return {"Age": str(int(self.age_s)), "Cache-Status": f"{CACHE_NAME}; {said}"}


@dataclass(slots=True, eq=False)
class _Reading:
    """One computation of an answer: when its reading began and the first cycle announced since."""

    key: Hashable
    epoch: int
    background: bool
    read_at: float | None = None  # None while a background refresh waits for its turn
    order: int = -1  # readings are numbered as they begin: a later one's answer replaces an earlier one's
    superseded_at: float | None = None
    task: asyncio.Task[bytes] | None = None


@dataclass(slots=True)
class _Entry:
    body: bytes
    read_at: float
    order: int
    superseded_at: float | None
    took: float = 0.0  # how long its reading took
    paced_until: float = field(default=-math.inf)  # no background refresh before this, if there is time
    retry_at: float = field(default=-math.inf)  # no background refresh before this (one failed)


class CycleCache:
    def __init__(
        self,
        conninfo: str,
        *,
        max_age_s: float,
        max_stale_s: float = 0.0,
        max_entries: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conninfo, self.max_age_s, self.max_stale_s = conninfo, max_age_s, max_stale_s
        self.max_entries, self.clock = max_entries, clock
        self._began = 0  # readings begun
        self.epoch = 0  # bumped when the listening connection comes up or goes: what was kept is forgotten
        self.listening = False
        self._entries: dict[Hashable, _Entry] = {}
        self._newest: dict[Hashable, _Reading] = {}  # the newest reading under way, by key
        self._refreshing: dict[Hashable, _Reading] = {}  # the one background refresh under way, by key
        self._readings: set[_Reading] = set()  # every reading under way
        self._refresh_slots: asyncio.Semaphore | None = None  # made in the loop that serves
        self._task: asyncio.Task[None] | None = None
        self.hits = self.stale_hits = self.misses = self.joined = 0
        self.refreshes = self.refresh_failures = 0

    @property
    def enabled(self) -> bool:
        return self.max_age_s > 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        """Stop listening and cancel every reading under way (their connections go back to the pool)."""
        tasks: list[asyncio.Task[Any]] = [r.task for r in self._readings if r.task is not None]
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._forget()
        self._refresh_slots = None

    def announced(self) -> None:
        """A scoring cycle was committed: every answer read before now is superseded (stale) from now."""
        now = self.clock()
        superseded: list[_Entry | _Reading] = [*self._entries.values(), *self._readings]
        for answer in superseded:
            if answer.superseded_at is None and answer.read_at is not None:
                answer.superseded_at = now

    def _forget(self) -> None:
        self.epoch += 1
        self._entries.clear()
        self._newest.clear()
        self._refreshing.clear()

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    schema = await listen_scored(conn)
                    self._forget()  # what was cached before listening may have missed a cycle
                    self.listening = True
                    async for note in conn.notifies():
                        if note.payload == schema:
                            self.announced()
            except (DatabaseError, psycopg.Error, OSError) as e:  # psycopg's: connecting, the notifies stream
                log.info("not caching: the scorer's announcements cannot be heard (%s)", e)
            finally:
                self.listening = False
                self._forget()
            await asyncio.sleep(1.0)

    def _stale_since(self, entry: _Entry) -> float | None:
        """When `entry` stopped being fresh (None: it is fresh)."""
        expired = entry.read_at + self.max_age_s
        if entry.superseded_at is not None:
            return min(entry.superseded_at, expired)
        return expired if self.clock() >= expired else None

    async def get_or_compute(self, key: Hashable, compute: Compute) -> Served:
        """The encoded answer for `key`: fresh, stale within `max_stale_s` (refreshing), or computed now."""
        now = self.clock()
        if not self.listening:
            self.misses += 1
            body = await asyncio.shield(self._start(key, compute, background=False, keep=False))
            return Served(body, 0.0, "bypass")
        entry = self._entries.get(key)
        if entry is not None:
            stale_since = self._stale_since(entry)
            if stale_since is None:
                self.hits += 1
                return Served(entry.body, now - entry.read_at, "hit")
            if now - stale_since < self.max_stale_s:
                self.stale_hits += 1
                self._refresh(key, compute, entry, now, now - stale_since)
                return Served(entry.body, now - entry.read_at, "stale", now - stale_since)
        newest = self._newest.get(key)
        if newest is not None and newest.task is not None and self._current(newest, now):
            self.joined += 1
            return self._served(newest, await asyncio.shield(newest.task), "joined")
        self.misses += 1
        reading = self._reading(key, compute, background=False)
        assert reading.task is not None
        return self._served(reading, await asyncio.shield(reading.task), "computed")

    def _current(self, reading: _Reading, now: float) -> bool:
        """Whether `reading` reads what a request arriving now may wait for: no cycle since, not too old."""
        if reading.superseded_at is not None:
            return False
        return reading.read_at is None or now - reading.read_at < self.max_age_s

    def _served(self, reading: _Reading, body: bytes, status: str) -> Served:
        now = self.clock()
        read_at = now if reading.read_at is None else reading.read_at
        stale_s = None if reading.superseded_at is None else now - reading.superseded_at
        return Served(body, now - read_at, status, stale_s)

    def _refresh(self, key: Hashable, compute: Compute, entry: _Entry, now: float, stale_s: float) -> None:
        """Start the one background refresh of `key`, unless one is under way, the last failed just now,
        or the database is still having its pause after the last and there is time for both."""
        if key in self._refreshing or now < entry.retry_at:
            return
        if now < entry.paced_until and stale_s + 2 * entry.took < self.max_stale_s:
            return
        newest = self._newest.get(key)
        if newest is not None and self._current(newest, now):
            return  # a request is already reading the answer this refresh would read
        self.refreshes += 1
        self._refreshing[key] = self._reading(key, compute, background=True)

    def _reading(self, key: Hashable, compute: Compute, *, background: bool) -> _Reading:
        reading = _Reading(key=key, epoch=self.epoch, background=background)
        self._newest[key] = reading
        reading.task = self._start(key, compute, background=background, keep=True, reading=reading)
        return reading

    def _start(
        self,
        key: Hashable,
        compute: Compute,
        *,
        background: bool,
        keep: bool,
        reading: _Reading | None = None,
    ) -> asyncio.Task[bytes]:
        reading = reading or _Reading(key=key, epoch=self.epoch, background=background)
        self._readings.add(reading)
        task = asyncio.get_running_loop().create_task(self._read(key, compute, reading, keep=keep))
        task.add_done_callback(_retrieved)
        return task

    async def _read(self, key: Hashable, compute: Compute, reading: _Reading, *, keep: bool) -> bytes:
        if self._refresh_slots is None:
            self._refresh_slots = asyncio.Semaphore(REFRESHES_AT_ONCE)
        try:
            async with self._refresh_slots if reading.background else contextlib.nullcontext():
                reading.read_at, reading.superseded_at, reading.order = self.clock(), None, self._began
                self._began += 1
                body = encode(await compute())
        except Exception as e:
            if reading.background:
                self.refresh_failures += 1
                entry = self._entries.get(key)
                if entry is not None and reading.epoch == self.epoch:
                    entry.retry_at = self.clock() + REFRESH_RETRY_S
                log.warning("refreshing a cached answer failed; the previous one is served meanwhile: %s", e)
            raise
        finally:
            self._readings.discard(reading)
            if self._newest.get(key) is reading:
                del self._newest[key]
            if self._refreshing.get(key) is reading:
                del self._refreshing[key]
        if keep:
            self._keep(key, reading, body)
        return body

    def _keep(self, key: Hashable, reading: _Reading, body: bytes) -> None:
        assert reading.read_at is not None
        if reading.epoch != self.epoch or not self.listening:
            return  # read before the listening connection (re)started: a cycle may have gone unheard
        kept = self._entries.get(key)
        if kept is not None and kept.order > reading.order:
            return  # a later reading already landed
        if kept is None and len(self._entries) >= self.max_entries:
            self._entries.clear()
        now = self.clock()
        took = now - reading.read_at
        self._entries[key] = _Entry(
            body, reading.read_at, reading.order, reading.superseded_at, took, now + took
        )


def _retrieved(done: asyncio.Future[bytes]) -> None:
    """Its error is retrieved even when every request that waited on it has gone."""
    if not done.cancelled():
        done.exception()


class CacheMetrics(Collector):
    """The cache's counters on /metrics: answers by how they were served, refreshes and their failures."""

    def __init__(self, cache: CycleCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        cache = self.cache
        served = CounterMetricFamily(
            "gpuhealth_api_cache_answers",
            "Cached endpoints' answers by how they were served",
            labels=["served"],
        )
        for label, count in (
            ("fresh", cache.hits),
            ("stale", cache.stale_hits),
            ("joined", cache.joined),
            ("computed", cache.misses),
        ):
            served.add_metric([label], count)
        yield served
        yield CounterMetricFamily(
            "gpuhealth_api_cache_refreshes",
            "Background refreshes of stale answers started",
            value=cache.refreshes,
        )
        yield CounterMetricFamily(
            "gpuhealth_api_cache_refresh_failures",
            "Background refreshes that failed (the stale answer was kept)",
            value=cache.refresh_failures,
        )
        yield GaugeMetricFamily(
            "gpuhealth_api_cache_listening",
            "1 while the scorer's announcements are heard",
            value=int(cache.listening),
        )

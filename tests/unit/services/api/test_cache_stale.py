"""Stale while it refreshes: whatever the order of cycles, requests, readings and their failures, the cache
serves an answer at once while it is stale for less than `max_stale_s`, never past it, never one whose
freshness it misstates, and reads each answer once at a time."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from services.api.cache import REFRESH_RETRY_S, REFRESHES_AT_ONCE, CacheMetrics, CycleCache, Served

MAX_AGE_S = 30.0


class Answer(BaseModel):
    key: str
    reading: int


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reading:
    """One call of a computation: what it read, when, after which step; it ends when the test says."""

    n: int
    key: str
    read_at: float
    after_step: float
    ends: asyncio.Future[bool]
    ok: bool | None = None  # None while it runs


@dataclass
class Request:
    key: str
    step: int
    at: float
    task: asyncio.Task[Served]
    done_step: int | None = None
    done_at: float | None = None


@dataclass
class World:
    """The test's own account of what happened, checked against what the cache answered."""

    clock: Clock
    step: float = 0
    readings: list[Reading] = field(default_factory=list)
    announced: list[tuple[float, float]] = field(default_factory=list)  # (step, time)

    def compute(self, key: str):  # type: ignore[no-untyped-def]
        async def read() -> Answer:
            ends = asyncio.get_running_loop().create_future()
            reading = Reading(len(self.readings), key, self.clock(), self.step + 0.5, ends)
            self.readings.append(reading)
            reading.ok = await ends
            if not reading.ok:
                raise RuntimeError(f"reading {reading.n} failed")
            return Answer(key=key, reading=reading.n)

        return read

    def superseded_at(self, reading: Reading) -> float:
        """When a reading's answer stopped being fresh: the first cycle announced after it began, or age."""
        after = [t for s, t in self.announced if s > reading.after_step]
        return min([*after[:1], reading.read_at + MAX_AGE_S])

    def fresh(self, reading: Reading, step: float, at: float) -> bool:
        """Fresh for a request at (step, at): no cycle announced since it began, younger than MAX_AGE_S."""
        cycles = any(reading.after_step < s < step for s, _ in self.announced)
        return not cycles and at - reading.read_at < MAX_AGE_S

    def kept(self, key: str) -> Reading | None:
        """The answer the cache should hold for key: the latest-begun reading of it that succeeded."""
        done = [r for r in self.readings if r.key == key and r.ok]
        return max(done, key=lambda r: r.n, default=None)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


Step = tuple[str, object]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("announce"), st.none()),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 4.0, 7.0, 12.0, 35.0])),
        st.tuples(st.just("request"), st.sampled_from(["summary", "gpus"])),
        st.tuples(st.just("end"), st.tuples(st.integers(0, 3), st.booleans())),
    ),
    min_size=6,
    max_size=30,
)


@settings(max_examples=400, deadline=None)
@given(script=steps, max_stale_s=st.sampled_from([0.0, 5.0, 10.0]))
def test_any_interleaving_of_cycles_requests_and_failures(script: list[Step], max_stale_s: float) -> None:
    async def scenario() -> None:
        clock = Clock()
        world = World(clock)
        cache = CycleCache("", max_age_s=MAX_AGE_S, max_stale_s=max_stale_s, clock=clock)
        cache.listening = True  # as once its LISTEN connection is up
        requests: list[Request] = []
        computes = {key: world.compute(key) for key in ("summary", "gpus")}

        for step, (kind, arg) in enumerate(script):
            world.step = step
            if kind == "announce":
                world.announced.append((step, clock.now))
                cache.announced()
            elif kind == "advance":
                assert isinstance(arg, float)
                clock.now += arg
            elif kind == "request":
                assert isinstance(arg, str)
                expected = world.kept(arg)
                task = asyncio.ensure_future(cache.get_or_compute(arg, computes[arg]))
                request = Request(arg, step, clock.now, task)
                requests.append(request)
            else:
                assert isinstance(arg, tuple)
                running = [r for r in world.readings if r.ok is None]
                if running:
                    running[arg[0] % len(running)].ends.set_result(arg[1])
            await settle()
            for request in requests:
                if request.done_step is None and request.task.done():
                    request.done_step, request.done_at = step, clock.now
            if kind == "request":
                check_served_at_once(world, requests[-1], expected, max_stale_s)
            check_single_flight(world, cache, clock.now)

        for request in requests:
            if request.done_step is not None:
                check_answer(world, request, max_stale_s)
        await cache.close()
        await settle()
        assert all(r.task.done() for r in requests), "a request was left waiting after close"
        assert not cache._readings

    asyncio.run(scenario())


def check_served_at_once(world: World, request: Request, kept: Reading | None, max_stale_s: float) -> None:
    """A fresh answer, or one stale for less than max_stale_s, is given at once; the request never waits."""
    if kept is None:
        return
    if world.fresh(kept, request.step, request.at):
        status = "hit"
    elif request.at - world.superseded_at(kept) < max_stale_s:
        status = "stale"
    else:
        return
    assert request.done_step == request.step, f"a {status} answer was not given at once"
    served = request.task.result()
    assert (served.status, decoded(served)) == (status, (kept.key, kept.n))


def check_answer(world: World, request: Request, max_stale_s: float) -> None:
    """Each answer is whole, says its true age, and is fresh, read for it, or stale less than max_stale_s."""
    if request.task.exception() is not None:
        assert request.done_step != request.step, "a failure was served where a kept answer should have been"
        return
    served = request.task.result()
    key, n = decoded(served)
    reading = world.readings[n]
    assert (key, reading.key, reading.ok) == (request.key, request.key, True), "another question's answer"
    assert request.done_at is not None
    assert served.age_s == pytest.approx(request.done_at - reading.read_at), "an Age not of this answer"
    if reading.after_step > request.step or world.fresh(reading, request.step, request.at):
        return  # read after the request came, or fresh when it came
    stale_s = request.at - world.superseded_at(reading)
    assert served.status == "stale"
    assert served.stale_s == pytest.approx(stale_s)
    assert stale_s < max_stale_s, f"served {stale_s} s stale (at most {max_stale_s})"
    assert request.done_step == request.step


def check_single_flight(world: World, cache: CycleCache, now: float) -> None:
    """At most one current reading of an answer at a time, one refresh per answer, REFRESHES_AT_ONCE all."""
    for key in ("summary", "gpus"):
        current = [
            r for r in world.readings if r.key == key and r.ok is None and world.fresh(r, world.step + 1, now)
        ]
        assert len(current) <= 1, f"{len(current)} readings of the same answer under way"
    refreshing = [r for r in cache._readings if r.background]
    assert len({r.key for r in refreshing}) == len(refreshing), "two refreshes of one answer"
    assert sum(r.read_at is not None for r in refreshing) <= REFRESHES_AT_ONCE


def decoded(served: Served) -> tuple[str, int]:
    answer = json.loads(served.body)
    return answer["key"], answer["reading"]


class Gate:
    """A computation that ends when `open()` is called, failing if told to."""

    def __init__(self) -> None:
        self.runs = 0
        self.fail = False
        self.opened = asyncio.Event()

    async def __call__(self) -> Answer:
        self.runs += 1
        await self.opened.wait()
        self.opened.clear()
        if self.fail:
            raise RuntimeError("the database said no")
        return Answer(key="summary", reading=self.runs)


async def primed(took_s: float = 0.0) -> tuple[Clock, CycleCache, Gate]:
    """A listening cache (max_stale_s 10) holding the summary's first answer, read in `took_s`."""
    clock = Clock()
    cache = CycleCache("", max_age_s=MAX_AGE_S, max_stale_s=10, clock=clock)
    cache.listening = True  # as once its LISTEN connection is up
    gate = Gate()
    first = asyncio.ensure_future(cache.get_or_compute("summary", gate))
    await settle()
    clock.now += took_s
    gate.opened.set()
    assert decoded(await first) == ("summary", 1)
    return clock, cache, gate


def test_a_failed_refresh_keeps_the_stale_answer_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="services.api.cache")

    async def scenario() -> None:
        clock, cache, gate = await primed()
        registry = CollectorRegistry()
        registry.register(CacheMetrics(cache))
        cache.announced()
        clock.now += 2
        gate.fail = True
        stale = await cache.get_or_compute("summary", gate)  # at once, and a refresh starts
        assert (decoded(stale), stale.status, stale.headers()) == (
            ("summary", 1),
            "stale",
            {"Age": "2", "Cache-Status": "gpu-health; hit; ttl=-2"},
        )
        gate.opened.set()
        await settle()
        assert (gate.runs, cache.refresh_failures) == (2, 1)
        assert "refreshing a cached answer failed" in caplog.text
        again = await cache.get_or_compute("summary", gate)  # kept; no new try within REFRESH_RETRY_S
        assert (decoded(again), gate.runs) == (("summary", 1), 2)
        clock.now += REFRESH_RETRY_S
        gate.fail = False
        await cache.get_or_compute("summary", gate)
        gate.opened.set()
        await settle()
        fresh = await cache.get_or_compute("summary", gate)
        assert (decoded(fresh), fresh.status, gate.runs) == (("summary", 3), "hit", 3)
        clock.now += 11  # then stale for longer than max_stale_s: the request waits for the new one
        cache.announced()
        clock.now += 10
        waiting = asyncio.ensure_future(cache.get_or_compute("summary", gate))
        await settle()
        assert not waiting.done()
        gate.opened.set()
        assert decoded(await waiting) == ("summary", 4)
        metrics = {
            (s.name, s.labels.get("served", "")): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples
        }
        assert metrics[("gpuhealth_api_cache_refresh_failures_total", "")] == 1
        assert metrics[("gpuhealth_api_cache_refreshes_total", "")] == 2
        assert metrics[("gpuhealth_api_cache_answers_total", "stale")] == 3
        assert metrics[("gpuhealth_api_cache_answers_total", "fresh")] == 1
        await cache.close()

    asyncio.run(scenario())


def test_close_cancels_the_refreshes_under_way() -> None:
    async def scenario() -> None:
        _, cache, gate = await primed()
        cache.announced()
        await cache.get_or_compute("summary", gate)  # starts a refresh that never ends by itself
        await settle()
        assert gate.runs == 2
        assert cache._readings
        await cache.close()
        assert not cache._readings
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())


@given(
    age_s=st.floats(min_value=0, max_value=1e6),
    stale_s=st.none() | st.floats(min_value=0, max_value=1e6),
    status=st.sampled_from(["hit", "stale", "joined", "computed", "bypass"]),
)
def test_the_freshness_headers_are_well_formed(age_s: float, stale_s: float | None, status: str) -> None:
    headers = Served(b"{}", age_s, status, stale_s).headers()
    assert int(headers["Age"]) == int(age_s) >= 0
    name, *params = headers["Cache-Status"].split("; ")
    assert name == "gpu-health"
    ttl = [int(p.removeprefix("ttl=")) for p in params if p.startswith("ttl=")]
    assert ttl == ([] if stale_s is None else [-int(-(-stale_s // 1))])


@pytest.mark.parametrize(("took_s", "paced"), [(2.0, True), (4.5, False)])
def test_refreshes_of_an_answer_leave_the_database_as_long_a_pause_as_they_took(
    took_s: float, paced: bool
) -> None:
    """A scorer committing in chunks announces many times a cycle: refreshes do not run back to back,
    unless pausing would risk max_stale_s (stale 1.9 s, then a 4.5 s pause and a 4.5 s reading would)."""

    async def scenario() -> None:
        clock, cache, gate = await primed(took_s)
        cache.announced()
        clock.now += 1.9
        assert (await cache.get_or_compute("summary", gate)).status == "stale"
        await settle()
        assert gate.runs == (1 if paced else 2), "paced" if paced else "no time to pause"
        clock.now += took_s
        assert (await cache.get_or_compute("summary", gate)).status == "stale"
        await settle()
        assert gate.runs == 2
        gate.opened.set()
        await settle()
        served = await cache.get_or_compute("summary", gate)
        assert (decoded(served), served.status) == (("summary", 2), "hit")
        await cache.close()

    asyncio.run(scenario())

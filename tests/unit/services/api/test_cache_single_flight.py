"""The cycle cache computes an answer once for all the requests that miss it at the same time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from services.api.cache import CycleCache


class Answer(BaseModel):
    computed: int


class Counting:
    """A computation that takes `delay_s` and counts how often it ran."""

    def __init__(self, delay_s: float = 0.01, fail: bool = False) -> None:
        self.runs, self.delay_s, self.fail = 0, delay_s, fail

    async def __call__(self) -> Answer:
        self.runs += 1
        run = self.runs
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("the database said no")
        return Answer(computed=run)


def listening_cache() -> CycleCache:
    cache = CycleCache("", max_age_s=60)
    cache.listening = True  # as once its LISTEN connection is up
    return cache


@settings(max_examples=30, deadline=None)
@given(clients=st.integers(min_value=1, max_value=64))
def test_concurrent_misses_share_one_computation(clients: int) -> None:
    async def scenario() -> None:
        cache, compute = listening_cache(), Counting()
        served = await asyncio.gather(*(cache.get_or_compute("summary", compute) for _ in range(clients)))
        assert compute.runs == 1
        assert {s.body for s in served} == {b'{"computed":1}'}
        assert (cache.misses, cache.joined) == (1, clients - 1)
        hit = await cache.get_or_compute("summary", compute)
        assert (hit.body, hit.status) == (b'{"computed":1}', "hit")
        assert cache.hits == 1

    asyncio.run(scenario())


def test_a_cycle_announced_meanwhile_starts_a_fresh_computation() -> None:
    async def scenario() -> None:
        cache, compute = listening_cache(), Counting(delay_s=0.05)
        first = asyncio.ensure_future(cache.get_or_compute("summary", compute))
        await asyncio.sleep(0.01)
        cache.announced()  # the scorer's next cycle committed while the first was being read
        second = await cache.get_or_compute("summary", compute)
        assert ((await first).body, second.body) == (b'{"computed":1}', b'{"computed":2}')
        assert compute.runs == 2

    asyncio.run(scenario())


def test_a_client_that_leaves_does_not_cancel_the_others() -> None:
    async def scenario() -> None:
        cache, compute = listening_cache(), Counting(delay_s=0.05)
        leaving = asyncio.ensure_future(cache.get_or_compute("summary", compute))
        staying = asyncio.ensure_future(cache.get_or_compute("summary", compute))
        await asyncio.sleep(0.01)
        leaving.cancel()
        assert (await staying).body == b'{"computed":1}'
        assert compute.runs == 1

    asyncio.run(scenario())


def test_a_failure_reaches_every_waiting_client_and_is_not_kept() -> None:
    async def scenario() -> None:
        cache, compute = listening_cache(), Counting(fail=True)
        outcomes = await asyncio.gather(
            *(cache.get_or_compute("summary", compute) for _ in range(3)), return_exceptions=True
        )
        assert [type(o) for o in outcomes] == [RuntimeError] * 3
        assert compute.runs == 1
        with pytest.raises(RuntimeError):
            await cache.get_or_compute("summary", compute)  # tried again, not a kept failure
        assert compute.runs == 2

    asyncio.run(scenario())


def test_without_listening_every_request_reads_for_itself() -> None:
    async def scenario() -> None:
        cache, compute = CycleCache("", max_age_s=60), Counting()  # not listening: nothing is shared
        await asyncio.gather(*(cache.get_or_compute("summary", compute) for _ in range(5)))
        assert compute.runs == 5

    asyncio.run(scenario())

"""Usage accounting against a simulated fleet whose true usage is known (tests/helpers/usage_fleet.py).

The fleet has gaps (a collector down for half an hour), collector restarts
shorter than a gap (no samples for under a minute, the work going on), driver
reloads (the energy counter starts again, between minutes and mid-minute), a
GPU that moved between hosts, labels that change mid-minute, a GPU shared by
two classes of work, one without process listings and one that reported once.
Every group's GPU-hours, busy and idle-while-allocated hours and energy are
checked against the truth computed from the pieces: within one poll interval
per stretch of reporting (and its power, for energy).
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from shared.plumbing.db import connect
from shared.plumbing.migrate import apply_migrations, discover
from shared.settings.common import DatabaseSettings
from shared.store.usage import DIMENSIONS, UsageQuery, usage_sync
from tests.helpers.usage_fleet import T0, Gpu, Piece, Run, store, truth, uuid_of

H = 3600.0
U = 1800.0  # the fleet's unit of time: it runs for 6 U
Stored = tuple[psycopg.Connection[Any], list[Gpu]]  # a connection to the fleet's schema, the fleet
ML, SERVE = "ml", "serve"


# fmt: off
def fleet() -> list[Gpu]:
    train = Piece(6 * U, job="train-a", pod="train-a-0", namespace=ML, power_w=400,
                  processes=(("training", "alice"),))
    serve = functools.partial(Piece, job="svc", pod="svc-0", namespace=SERVE)
    batch = functools.partial(Piece, job="batch", namespace="ops", processes=(("compute", "frank"),))
    return [
        Gpu(uuid_of(0), [Run("n1", 0, (train,), jitter_s=2.0)]),
        Gpu(uuid_of(1), [
            Run("n1", 0, (serve(2 * U, power_w=300, processes=(("inference", "bob"),)),)),
            # the collector was down for half an hour; the pod stayed, its process hung
            Run("n1", 2.5 * U, (serve(1.5 * U, busy=False, power_w=80, processes=(("inference", "bob"),)),)),
            # the driver reloaded at once: the counter starts from zero, no gap
            Run("n1", 4 * U, (serve(2 * U, power_w=350, processes=(("llm_serving", "carol"),)),),
                reset=True),
        ]),
        # moved from n1 to n2 (20 minutes in between, a fresh driver there), polled every 2 s there
        Gpu(uuid_of(2), [
            Run("n1", 0, (Piece(1.5 * U, job="train-b", namespace=ML, processes=(("training", "alice"),)),)),
            Run("n2", 1.5 * U + 1200, (Piece(3 * U, job="train-b", namespace=ML,
                                             processes=(("training", "alice"),)),), poll_s=2.0, reset=True),
        ]),
        # nobody's: no labels, never listed, idle
        Gpu(uuid_of(3), [Run("n2", 0, (Piece(6 * U, busy=False, power_w=60, listed=False),))]),
        # labels change between minutes' edges; then nothing runs on it
        Gpu(uuid_of(4), [Run("n3", 0, (
            Piece(U + 433, job="a", namespace=ML, processes=(("training", "alice"),)),
            Piece(3 * U, job="b", namespace="research", processes=(("compute", "dave"),), power_w=250),
            Piece(6 * U, busy=False, power_w=70),
        ), jitter_s=3.0)]),
        # two kinds of work share the GPU
        Gpu(uuid_of(5), [Run("n3", 0, (Piece(6 * U, namespace="shared",
                                             processes=(("training", "alice"), ("compute", "dave"))),))]),
        # reported once, then came back an hour later
        Gpu(uuid_of(6), [Run("n4", 600, (Piece(5, job="blip", namespace=ML),)),
                         Run("n4", 1.5 * U, (Piece(U, job="blip", namespace=ML, power_w=200),))]),
        Gpu(uuid_of(7), [Run("ws1", 0, (Piece(3 * U, processes=(("gaming", "erin"),), power_w=220),),
                             poll_s=5.0)]),
        # its collector restarted three times (40 to 55 s without samples, once across a minute's edge)
        # and its driver reloaded 25 s into a minute, the job going on throughout
        Gpu(uuid_of(8), [
            Run("n5", 0, (batch(2 * U + 25),), silent=((1000, 1040), (2995, 3030))),
            Run("n5", 2 * U + 25, (batch(U - 25),), reset=True, silent=((600, 645),)),
        ]),
    ]
# fmt: on


@pytest.fixture(scope="module")
def fleet_db(db_settings: DatabaseSettings) -> Iterator[DatabaseSettings]:
    """One schema holding the fleet for the module's tests (they read it; the replay adds nothing)."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with connect(db_settings, autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    scoped = db_settings.model_copy(update={"search_path": name})
    try:
        with connect(scoped) as c:
            apply_migrations(c, discover())
            store(c, fleet())
        yield scoped
    finally:
        with connect(db_settings, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def stored(fleet_db: DatabaseSettings) -> Iterator[tuple[psycopg.Connection[Any], list[Gpu]]]:
    with connect(fleet_db) as c:
        yield c, fleet()


def check(conn: psycopg.Connection[Any], gpus: list[Gpu], by: str, start_s: float, end_s: float) -> None:
    q = UsageQuery(start=T0 + timedelta(seconds=start_s), end=T0 + timedelta(seconds=end_s), by=by)
    answer = usage_sync(conn, q)
    want = truth(gpus, by, start_s, end_s)
    got = {r["key"]: r for r in answer.groups}
    assert set(got) == {k for k, s in want.seconds.items() if s > 0}, by
    for key, row in got.items():
        slack = want.poll_s[key] * want.runs[key]
        where = f"by {by} = {key}"
        assert row["gpu_hours"] * H == pytest.approx(want.seconds[key], abs=slack), where
        assert row["busy_hours"] * H == pytest.approx(want.busy_s[key], abs=slack), where
        assert row["idle_allocated_hours"] * H == pytest.approx(want.idle_allocated_s[key], abs=slack), where
        assert row["energy_kwh"] * 3.6e9 == pytest.approx(want.energy_mj[key], abs=slack * 400 * 1000), where
    (total,) = answer.totals
    assert total["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in got.values()))
    assert total["energy_kwh"] == pytest.approx(sum(r["energy_kwh"] for r in got.values()))
    assert total["gpus"] == len(
        {g.uuid for g in gpus if any(truth([g], "gpu", start_s, end_s).seconds.values())}
    )


@pytest.mark.parametrize("by", sorted(DIMENSIONS))
def test_every_group_is_within_a_poll_interval_of_the_truth(stored: Stored, by: str) -> None:
    conn, gpus = stored
    check(conn, gpus, by, 0, 6 * U)
    check(conn, gpus, by, U, 5 * U)  # runs cut by the window's edges


def first_three_hours(conn: psycopg.Connection[Any], gpu: str) -> dict[str, Any]:
    q = UsageQuery(start=T0, end=T0 + timedelta(hours=3), by="gpu", filters={"gpu": gpu})
    (row,) = usage_sync(conn, q).groups
    return row


def test_a_gpu_that_stopped_reporting_is_neither_busy_nor_idle_and_its_gap_has_no_energy(
    stored: Stored,
) -> None:
    row = first_three_hours(stored[0], uuid_of(1))
    assert row["gpu_hours"] == pytest.approx(2.75, abs=10 / H)
    assert row["busy_hours"] == pytest.approx(2.0, abs=20 / H)
    assert row["idle_allocated_hours"] == pytest.approx(0.75, abs=10 / H)
    # 1 h at 300 W + 45 min at 80 W + 1 h at 350 W; the quarter hour at 55 W in the gap is nobody's;
    # each run's last poll interval (10 s at its power) follows its last reading
    assert row["energy_kwh"] == pytest.approx(0.3 + 0.06 + 0.35, abs=10 * (300 + 80 + 350) / 3.6e6)


def test_a_collector_restart_shorter_than_a_gap_is_bridged_and_a_reload_mid_minute_keeps_the_counters_energy(
    stored: Stored,
) -> None:
    row = first_three_hours(stored[0], uuid_of(8))
    # 1.5 h of work at 400 W: the restarts' silences count (the job went on)
    assert row["gpu_hours"] == pytest.approx(1.5, abs=10 / H)
    assert row["busy_hours"] == pytest.approx(1.5, abs=10 / H)
    # the counter's increase to the joule: all of it but the 10 s after the last reading and the 5 s
    # between the last reading before the reload and the reload, which the reset counter cannot give back
    assert row["energy_kwh"] == pytest.approx((1.5 * H - 15) * 400 / 3.6e6, abs=1e-6)


def test_energy_is_the_energy_counters_increase_never_power_times_time(
    conn: psycopg.Connection[Any],
) -> None:
    work = (Piece(U, namespace="e", power_w=400),)
    lying, blind, no_counter = uuid_of(0, 0xE1), uuid_of(1, 0xE1), uuid_of(2, 0xE1)
    store(conn, [
        Gpu(lying, [Run("e1", 0, work)], gauge_scale=4.0),  # the power gauge reads 1,600 W
        Gpu(blind, [Run("e1", 0, work)], gauge_scale=None),  # no power gauge at all
        Gpu(no_counter, [Run("e1", 0, work)], has_counter=False),  # the gauge only: no energy
    ])  # fmt: skip
    answer = usage_sync(conn, UsageQuery(start=T0, end=T0 + timedelta(hours=1), by="gpu"))
    energy = {r["key"]: r["energy_kwh"] for r in answer.groups}
    # from the first reading to the last (0 to 1,790 s) at 400 W, to the joule
    assert energy[lying] == pytest.approx(1790 * 400 / 3.6e6, abs=1e-6)
    assert energy[blind] == energy[lying]
    assert energy[no_counter] is None
    (total,) = answer.totals
    assert total["energy_kwh"] == pytest.approx(2 * energy[lying])
    assert total["gpu_hours"] == pytest.approx(1.5, abs=30 / H)


def test_filters_narrow_and_the_totals_are_of_what_they_keep(
    stored: Stored,
) -> None:
    conn, gpus = stored
    start, end = T0, T0 + timedelta(hours=3)
    ml = usage_sync(conn, UsageQuery(start, end, by="class", filters={"namespace": ML}))
    # gpu 6 ran no process; the minute gpu 4 went from training in ml to compute elsewhere is split
    # by the minute's shares, labels and classes alike
    assert {r["key"] for r in ml.groups if r["gpu_hours"] > 1 / 60} == {"training", "none"}
    (total,) = ml.totals
    want = truth(gpus, "namespace", 0, 6 * U).seconds[ML]
    assert total["gpu_hours"] * H == pytest.approx(want, abs=60)
    alice = usage_sync(
        conn, UsageQuery(start, end, by="namespace", filters={"user": "alice", "class": "training"})
    )
    assert {r["key"] for r in alice.groups if r["gpu_hours"] > 1 / 60} == {ML, "shared"}
    shared = next(r for r in alice.groups if r["key"] == "shared")
    assert shared["gpu_hours"] == pytest.approx(1.5, abs=30 / H)  # half of gpu 5's three hours


def test_a_timeline_has_a_total_per_period_that_adds_up(stored: Stored) -> None:
    conn, _ = stored
    q = UsageQuery(start=T0, end=T0 + timedelta(hours=3), by="class", step=timedelta(hours=1))
    answer = usage_sync(conn, q)
    assert [t["period"] for t in answer.totals] == [T0 + timedelta(hours=h) for h in range(3)]
    for t in answer.totals:
        in_period = [g for g in answer.groups if g["period"] == t["period"]]
        assert t["gpu_hours"] == pytest.approx(sum(g["gpu_hours"] for g in in_period))
    whole = usage_sync(conn, UsageQuery(start=q.start, end=q.end, by="class"))
    assert sum(t["gpu_hours"] for t in answer.totals) == pytest.approx(whole.totals[0]["gpu_hours"], abs=0.05)


def test_a_replayed_batch_and_a_second_refresh_change_nothing(
    stored: Stored,
) -> None:
    conn, gpus = stored
    q = UsageQuery(start=T0, end=T0 + timedelta(hours=3), by="namespace")
    before = usage_sync(conn, q)
    store(conn, gpus[:2])  # the same samples and polls again: stored before, nothing new
    assert usage_sync(conn, q) == before


# ---------------------------------------------------------------- the interval arithmetic, at random
EXAMPLES = itertools.count(1)


@st.composite
def lives(draw: st.DrawFn) -> list[Run]:
    """One GPU's runs: gaps of none or over two minutes, resets, host moves, polls of 2 to 30 s, jitter,
    and collector restarts inside a run (no samples for less than a minute, the work going on)."""
    runs: list[Run] = []
    at = draw(st.floats(0, 600))
    host = "h0"
    for _ in range(draw(st.integers(1, 4))):
        poll = draw(st.sampled_from([2.0, 5.0, 10.0, 30.0]))
        pieces: list[Piece] = []
        until = 0.0
        for _ in range(draw(st.integers(1, 3))):
            until += draw(st.floats(1.0, 900.0))
            pieces.append(Piece(until, job=draw(st.sampled_from([None, "a", "b"])),
                                busy=draw(st.booleans()), power_w=draw(st.floats(50, 700)),
                                processes=draw(st.sampled_from([(), (("training", "u"),)]))))  # fmt: skip
        moved: bool = draw(st.booleans())
        if runs and moved:
            host = f"h{len(runs)}"
        jitter: float = draw(st.sampled_from([0.0, poll / 4]))
        reset: bool = draw(st.booleans())
        silent: tuple[tuple[float, float], ...] = ()
        # the gap between samples around a restart stays within max_gap (60 s), and it neither opens
        # nor closes the run
        if draw(st.booleans()) and until > (quiet := draw(st.floats(1.0, 59.0 - poll - jitter))) + 3 * poll:
            begin = draw(st.floats(poll, until - quiet - 2 * poll))
            silent = ((begin, begin + quiet),)
        runs.append(Run(host, at, tuple(pieces), poll_s=poll, jitter_s=jitter, reset=reset, silent=silent))
        at = runs[-1].end_s + draw(st.sampled_from([0.0, 121.0, 900.0, 4000.0]))
    return runs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=lives())
def test_any_life_of_a_gpu_is_accounted_within_a_poll_interval_a_run(
    conn: psycopg.Connection[Any], runs: list[Run]
) -> None:
    g = Gpu(uuid_of(0, next(EXAMPLES)), runs)  # a GPU of its own: the schema outlives the example
    store(conn, [g])
    end_s = max(r.end_s for r in runs) + 120
    answer = usage_sync(conn, UsageQuery(start=T0, end=T0 + timedelta(seconds=end_s), by="gpu",
                                         filters={"gpu": g.uuid}))  # fmt: skip
    want = truth([g], "gpu", 0, end_s)
    (row,) = answer.groups
    # a run of one sample counts the default poll (10 s), whatever its own
    slack = sum(max(r.poll_s, r.list_s, 10.0) * len(r.pieces) for r in runs)
    # a restart's silence is counted, shared among the samples after it: near a change of work it may
    # go to the next piece
    shifted = slack + sum(b - a for r in runs for a, b in r.silent)
    assert row["gpu_hours"] * H == pytest.approx(want.seconds[g.uuid], abs=slack)
    assert row["busy_hours"] * H == pytest.approx(want.busy_s[g.uuid], abs=shifted)
    assert row["idle_allocated_hours"] * H == pytest.approx(want.idle_allocated_s[g.uuid], abs=shifted)
    assert row["energy_kwh"] * 3.6e9 == pytest.approx(want.energy_mj[g.uuid], abs=slack * 700 * 1000)
    # each host is given the time the GPU reported from it, however it moved
    by_host = usage_sync(conn, UsageQuery(start=T0, end=T0 + timedelta(seconds=end_s), by="hostname",
                                          filters={"gpu": g.uuid}))  # fmt: skip
    hosts = truth([g], "hostname", 0, end_s).seconds
    assert {r["key"]: r["gpu_hours"] * H for r in by_host.groups} == {
        host: pytest.approx(seconds, abs=sum(max(r.poll_s, r.list_s, 10.0) * len(r.pieces)
                                             for r in runs if r.host == host))
        for host, seconds in hosts.items()
    }  # fmt: skip

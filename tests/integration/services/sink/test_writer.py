"""The straight COPY and the rollup refreshed after the batch, on the real database."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from evaluation.pipeline import wait_until
from services.scorer.features import read_features
from services.scorer.rules_config import load_rules
from services.sink.deadletters import Origin
from services.sink.metrics import SinkMetrics
from services.sink.rollup import RollupRefresher
from services.sink.rows import STAGE_COLUMNS, stage_row
from services.sink.writer import Batch, BatchWriter
from shared.fakes.samples import T0, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.sink import count

GPUS = 5
JOB = STAGE_COLUMNS.index("job")
_ROLLUP = (
    "SELECT bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n, gpu_temp_c_max, power_usage_w_sum"
    " FROM gpu_metrics_1min ORDER BY 1, 2"
)
_FROM_RAW = (
    "SELECT public.time_bucket(interval '1 minute', time), gpu_uuid, count(*), sum(gpu_temp_c),"
    " count(gpu_temp_c), max(gpu_temp_c), sum(power_usage_w) FROM gpu_metrics GROUP BY 1, 2 ORDER BY 1, 2"
)


def rows(indices: range | list[int]) -> list[tuple[Any, ...]]:
    return [stage_row(json.dumps(sample(i, GPUS)).encode()) for i in indices]


def batch(indices: range | list[int], offset: int = 0) -> Batch:
    """The samples as staging rows, each with its message as its origin."""
    values = [json.dumps(sample(i, GPUS)).encode() for i in indices]
    origins: list[Origin] = [("raw", 0, offset + k, None, v) for k, v in enumerate(values)]
    next_offsets = {("raw", 0): offset + len(indices)}
    return Batch(rows=list(map(stage_row, values)), next_offsets=next_offsets, row_origins=origins)


def query(db: DatabaseSettings, text: str) -> list[tuple[Any, ...]]:
    with connect(db) as conn:
        return [tuple(r) for r in conn.execute(text).fetchall()]


def refresher(db: DatabaseSettings, registry: CollectorRegistry | None = None) -> RollupRefresher:
    return RollupRefresher(db, SinkMetrics(registry or CollectorRegistry()), interval_s=0.05)


def lag_on_metrics(registry: CollectorRegistry) -> float:
    """gpuhealth_sink_rollup_lag_seconds as /metrics shows it."""
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("gpuhealth_sink_rollup_lag_seconds "):
            return float(line.split()[1])
    raise AssertionError("no rollup lag on /metrics")


def test_a_new_batch_is_copied_straight_and_a_replay_takes_the_careful_path(
    migrated: DatabaseSettings,
) -> None:
    registry = CollectorRegistry()
    writer, rollup = BatchWriter(migrated, group="g", connections=1), refresher(migrated, registry)
    try:
        first = writer.write(batch(range(100)))
        again = writer.write(batch(range(100)))  # a replay: nothing new
        partly = writer.write(batch(range(50, 150), offset=100))  # half of it stored before
        # the rollup is not refreshed yet: readers are told to keep before the first noted minute
        settled = query(migrated, "SELECT gpu_metrics_1min_settled()")[0][0]
        assert settled == T0
        assert count(migrated, "gpu_metrics_1min") == 0
        rollup.stored()
        wait_until(lambda: lag_on_metrics(registry) > 0, 10, "the lag to show on /metrics")
        assert rollup.refresh()
        assert lag_on_metrics(registry) == 0.0
    finally:
        writer.close()
        rollup.close()
    assert (first.optimistic, first.metrics_inserted) == (True, 100)
    assert (again.optimistic, again.metrics_inserted) == (False, 0)
    assert (partly.optimistic, partly.metrics_inserted) == (False, 50)
    assert count(migrated, "gpu_metrics") == 150
    assert count(migrated, "gpu_latest") == GPUS
    assert query(migrated, "SELECT next_offset FROM kafka_offsets WHERE consumer_group = 'g'") == [(200,)]
    assert count(migrated, "gpu_metrics_1min_pending") == 0
    assert query(migrated, "SELECT gpu_metrics_1min_settled() = 'infinity'") == [(True,)]
    assert query(migrated, _ROLLUP) == query(migrated, _FROM_RAW)
    assert len(query(migrated, _ROLLUP)) == GPUS * len({sample(i, GPUS)["time"][:16] for i in range(150)})


def test_a_value_the_straight_copy_refuses_is_isolated_and_the_rest_stored(
    migrated: DatabaseSettings,
) -> None:
    """A NUL in an older row of a GPU: the newest rows stage fine, the straight COPY refuses it."""
    writer = BatchWriter(migrated, group="g", connections=1)
    b = batch(range(40))
    b.rows[2] = (*b.rows[2][:JOB], "a\x00b", *b.rows[2][JOB + 1 :])
    try:
        result = writer.write(b)
        replay = writer.write(b)
    finally:
        writer.close()
    assert (result.optimistic, result.metrics_inserted, result.refused_rows) == (False, 39, 1)
    assert (result.dead_recorded, replay.dead_recorded) == (1, 1)
    assert replay.metrics_inserted == 0
    assert count(migrated, "gpu_metrics") == 39
    assert count(migrated, "sink_dead_letters") == 1
    assert query(migrated, "SELECT next_offset FROM kafka_offsets") == [(40,)]


def test_a_sample_the_database_refuses_is_isolated_with_its_own_message(
    migrated: DatabaseSettings,
) -> None:
    """A value the contract allows but this database refuses (a CHECK of its own): the straight
    COPY fails, and so does the careful path, and the one refused row becomes a dead letter
    carrying its own message; the rest is stored."""
    with connect(migrated) as conn:
        conn.execute(
            "ALTER TABLE gpu_metrics ADD CONSTRAINT local_rule CHECK (job IS DISTINCT FROM 'refused')"
        )
    writer = BatchWriter(migrated, group="g", connections=1)
    b = batch(range(40))
    refused = json.dumps({**sample(2, GPUS), "job": "refused"}).encode()
    b.row_origins[2] = (*b.row_origins[2][:4], refused)
    b.rows[2] = stage_row(refused)
    try:
        result = writer.write(b)
    finally:
        writer.close()
    assert (result.optimistic, result.metrics_inserted, result.refused_rows) == (False, 39, 1)
    assert count(migrated, "gpu_metrics") == 39
    assert query(migrated, "SELECT source_offset, value FROM sink_dead_letters") == [(2, refused)]
    assert query(migrated, "SELECT next_offset FROM kafka_offsets") == [(40,)]


def test_the_scorer_reads_only_refreshed_minutes(migrated: DatabaseSettings) -> None:
    writer, rollup = BatchWriter(migrated, group="g", connections=1), refresher(migrated)
    as_of = T0 + timedelta(minutes=10)
    rules = load_rules()
    try:
        writer.write(batch(range(60 * GPUS)))  # 10 minutes of samples, 10 s apart
        with connect(migrated) as conn:
            before = read_features(conn, as_of, rules)
        rollup.stored()
        assert rollup.refresh()
        with connect(migrated) as conn:
            after = read_features(conn, as_of, rules)
    finally:
        writer.close()
        rollup.close()
    assert len(before) == len(after) == GPUS
    assert {g.minutes_long for g in before.values()} == {0}
    assert {g.minutes_long for g in after.values()} == {10}


def settled(db: DatabaseSettings) -> datetime:
    (first,) = query(db, "SELECT gpu_metrics_1min_settled()")[0]
    return first  # type: ignore[no-any-return]


def test_a_refresh_takes_only_the_minutes_every_partition_still_being_filled_has_passed(
    migrated: DatabaseSettings,
) -> None:
    """Two sinks: `mine` holds partition 0 (stored up to minute 9), the other partition 1 (up to 4:30)."""
    p0, p1 = ("raw", 0), ("raw", 1)
    writer = BatchWriter(migrated, group="g", connections=1)
    mine, other = (
        RollupRefresher(migrated, SinkMetrics(CollectorRegistry()), complete_for=("g", "raw"))
        for _ in range(2)
    )

    def at(minutes: float) -> datetime:
        return T0 + timedelta(minutes=minutes)

    def pending() -> int:
        return int(query(migrated, "SELECT count(*) FROM gpu_metrics_1min_pending")[0][0])

    try:
        part = batch(range(60 * GPUS))  # 10 minutes of samples
        part.next_offsets, part.frontiers = {p0: 10, p1: 10}, {p0: at(9), p1: at(4.5)}
        writer.write(part)
        # behind: minutes 0-3 are done; 4-9 wait for partition 1
        mine.stored(caught_up=False)
        assert mine.refresh()
        assert settled(migrated) == at(4)
        assert {b for (b,) in query(migrated, "SELECT DISTINCT bucket FROM gpu_metrics_1min")} == {
            at(m) for m in range(4)
        }
        assert mine.lag_s() > 0  # what still waits is on /metrics
        # caught up with its own partition: it still leaves the other's minutes to the other
        mine.caught_up([p0])
        assert mine.refresh()
        assert settled(migrated) == at(4)
        # the other catches up too: nothing holds back any more, everything is refreshed
        other.caught_up([p1])
        assert other.refresh()
        assert pending() == 0
        assert other.lag_s() == 0
        # a frontier never moves back; a batch clears its partitions' caught-up mark
        writer.write(
            Batch(rows=rows(range(60 * GPUS, 61 * GPUS)), next_offsets={p1: 11}, frontiers={p1: at(1)})
        )
        assert query(migrated, "SELECT frontier, caught_up FROM kafka_offsets ORDER BY partition") == [
            (at(9), True),
            (at(4.5), False),
        ]
        mine.stored(caught_up=True)
        mine.caught_up([p0])
        assert mine.refresh()
        assert pending() == 1  # minute 10, which partition 1 (busy, behind) has not passed
        # partition 1 has stored no sample for two minutes (only refused records since: its offsets
        # move, its frontier does not): it no longer holds anyone back
        with connect(migrated) as conn:
            conn.execute(
                "UPDATE kafka_offsets SET frontier_at = now() - interval '2 min' WHERE partition = 1"
            )
        writer.write(Batch(next_offsets={p1: 12}))
        assert mine.refresh()
        assert pending() == 0
    finally:
        writer.close()
        mine.close()
        other.close()
    assert query(migrated, _ROLLUP) == query(migrated, _FROM_RAW)


def temp_bytes(conn: Any) -> int:
    """Bytes of temporary files this database has written, as of now (statistics flushed)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_refresh_of_a_large_fleet_aggregates_in_memory(migrated: DatabaseSettings) -> None:
    """Three polls of 12,000 GPUs: 36,000 samples in 12,000+ groups of aggregates, more than
    PostgreSQL's default memory for a hash or a sort (work_mem 4 MB), so without 0017 the
    refresh spilled to temporary files (~4 MB here)."""
    gpus = 12_000
    writer = BatchWriter(migrated, group="g", connections=1)
    try:
        writer.write(Batch(rows=[stage_row(json.dumps(sample(i, gpus))) for i in range(3 * gpus)]))
    finally:
        writer.close()
    with connect(migrated, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        before = temp_bytes(conn)
        conn.execute("SELECT gpu_metrics_1min_refresh(interval '100 years')")
        conn.execute("SELECT pg_stat_force_next_flush()")
        after = temp_bytes(conn)
        (groups,) = conn.execute("SELECT count(*) FROM gpu_metrics_1min").fetchone() or (0,)
    assert groups == len({(i % gpus, sample(i, gpus)["time"][:16]) for i in range(3 * gpus)})
    assert after == before


_SETTLED_ROLLUP = (
    "SELECT bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n, gpu_temp_c_max, power_usage_w_sum"
    " FROM gpu_metrics_1min WHERE bucket < gpu_metrics_1min_settled() ORDER BY 1, 2"
)
_SETTLED_FROM_RAW = (
    "SELECT public.time_bucket(interval '1 minute', time), gpu_uuid, count(*), sum(gpu_temp_c),"
    " count(gpu_temp_c), max(gpu_temp_c), sum(power_usage_w) FROM gpu_metrics"
    " WHERE time < gpu_metrics_1min_settled() GROUP BY 1, 2 ORDER BY 1, 2"
)
NO_REFRESH, CAUGHT_UP, BEHIND = 0, 1, 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(
        st.tuples(
            st.integers(0, 400),  # first sample
            st.integers(1, 150),  # samples
            st.sampled_from([NO_REFRESH, CAUGHT_UP, BEHIND]),  # then, a refresh of all or of the complete
            st.integers(-2, 20),  # the batch's frontier, minutes after T0 (the samples span 0..18)
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_rollup_equals_the_raw_rows_whatever_is_replayed_and_whenever_it_refreshes(
    migrated: DatabaseSettings, parts: list[tuple[int, int, int, int]]
) -> None:
    """Overlapping batches (replays), refreshes of everything or only of the minutes before the
    frontier (whatever the frontier says, true or not): whatever is settled is the raw rows'
    aggregate, and after a last refresh the whole rollup is."""
    with connect(migrated) as conn:
        conn.execute(
            "TRUNCATE gpu_metrics, gpu_metrics_1min, gpu_metrics_1min_pending, gpu_latest, gpu_assets,"
            " kafka_offsets"
        )
        conn.commit()
    writer = BatchWriter(migrated, group="g", connections=1)
    rollup = RollupRefresher(
        migrated, SinkMetrics(CollectorRegistry()), interval_s=0.05, complete_for=("g", "raw")
    )
    stored: set[int] = set()
    try:
        for start, length, refresh, frontier in parts:
            indices = range(start, start + length)
            part = batch(indices, offset=start)
            part.frontiers = {("raw", 0): T0 + timedelta(minutes=frontier)}
            result = writer.write(part)
            assert result.metrics_inserted == len(set(indices) - stored)
            assert result.optimistic == (not set(indices) & stored)
            stored |= set(indices)
            rollup.stored(caught_up=refresh != BEHIND)
            if refresh == CAUGHT_UP:
                rollup.caught_up([("raw", 0)])
            if refresh != NO_REFRESH:
                assert rollup.refresh()
                assert query(migrated, _SETTLED_ROLLUP) == query(migrated, _SETTLED_FROM_RAW)
        rollup.caught_up([("raw", 0)])
        assert rollup.refresh()
    finally:
        writer.close()
        rollup.close()
    assert count(migrated, "gpu_metrics") == len(stored)
    assert query(migrated, _ROLLUP) == query(migrated, _FROM_RAW)

"""A cycle judged in chunks, on the real database: each chunk its own transaction.

What chunks must not change is what a cycle concludes: the same statuses,
verdicts and alerts as one judgement of the whole share, however the fleet's
faults fall across chunk boundaries (a host's XIDs split over two chunks still
make one host finding). What they must change is how long a cycle holds a GPU:
once a chunk is committed, another judgement of its GPUs (the event fast path)
takes them at once, and a stop between chunks ends the cycle there.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.scorer.build import build_scorer
from services.scorer.cycle import CycleResult, judge, judge_in_chunks
from services.scorer.rules_config import load_rules
from services.scorer.settings import ScorerSection, ScorerSettings
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.scorer_fleet import StopAfter, add_fleet, add_xids
from tests.helpers.topics import isolated_topics

RULES = load_rules()
T0 = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
GPUS = [f"GPU-{uuid.UUID(int=i)}" for i in range(24)]  # three hosts of eight
XIDS = (13, 31, 48, 63, 79, 94, 95, 119)


def _add_xids(conn: psycopg.Connection[Any], xids: list[tuple[int, int, int]]) -> None:
    """(GPU index, XID, seconds before T0) as gpu_events rows; committed."""
    add_xids(conn, GPUS, T0, xids)


def _concluded(conn: psycopg.Connection[Any]) -> tuple[list[tuple[Any, ...]], ...]:
    """What the database holds of the judgement: statuses, current verdicts, unresolved alerts."""
    return tuple(
        conn.execute(query).fetchall()
        for query in (
            "SELECT gpu_uuid, state, score, action FROM gpu_status ORDER BY 1",
            "SELECT gpu_uuid, subsystem, state, rule FROM gpu_health_current ORDER BY 1, 2",
            "SELECT gpu_uuid, kind, severity FROM gpu_alerts WHERE state <> 'resolved' ORDER BY 1, 2",
        )
    )


faults = st.lists(
    st.tuples(st.integers(0, len(GPUS) - 1), st.sampled_from(XIDS), st.integers(1, 3600)), max_size=14
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(xids=faults, chunk=st.integers(1, len(GPUS) + 3))
def test_chunks_conclude_what_one_judgement_of_the_share_concludes(
    migrated: DatabaseSettings, xids: list[tuple[int, int, int]], chunk: int
) -> None:
    with connect(migrated) as conn:
        add_fleet(conn, GPUS, T0, fresh=True)
        _add_xids(conn, xids)
        whole = judge(conn, T0, RULES, gpus=GPUS, predictions={})
        expected = _concluded(conn)
        add_fleet(conn, GPUS, T0, fresh=True)
        _add_xids(conn, xids)
        seen: list[int] = []
        chunked = judge_in_chunks(conn, T0, RULES, GPUS, chunk=chunk, predictions={},
                                  committed=lambda r: seen.append(r.gpus))  # fmt: skip
        assert _concluded(conn) == expected
    assert seen == [min(chunk, len(GPUS) - start) for start in range(0, len(GPUS), chunk)]
    counted = (chunked.gpus, chunked.states, chunked.alerts_opened, chunked.cut_short)
    assert counted == (whole.gpus, whole.states, whole.alerts_opened, False)
    assert sorted(m[1] for m in chunked.messages) == sorted(m[1] for m in whole.messages)


def test_a_committed_chunk_is_free_for_the_event_path_while_the_cycle_goes_on(
    migrated: DatabaseSettings,
) -> None:
    """Each chunk's GPUs are judged again by another connection, from inside the cycle, under a lock
    timeout: were the cycle one transaction, they would be locked until it ended."""
    with connect(migrated) as conn:
        add_fleet(conn, GPUS, T0, fresh=True)
        _add_xids(conn, [(3, 79, 5), (12, 48, 5)])

    later = T0 + timedelta(seconds=1)
    taken: list[int] = []

    def event_path_judges(chunk: CycleResult) -> None:
        part = GPUS[8 * len(taken) : 8 * len(taken) + 8]
        with connect(migrated) as other:
            other.execute("SET lock_timeout = '2s'")
            taken.append(judge(other, later, RULES, gpus=part, predictions={}).gpus)

    with connect(migrated) as conn:
        result = judge_in_chunks(conn, T0, RULES, GPUS, chunk=8, predictions={}, committed=event_path_judges)
        assert result.gpus == len(GPUS)
        # the later judgement of each chunk stands: the cycle claimed nothing it had taken since
        times = conn.execute("SELECT DISTINCT as_of FROM gpu_status").fetchall()
    assert taken == [8, 8, 8]
    assert times == [(later,)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(1, 10), after=st.integers(1, 4))
def test_a_stop_between_chunks_ends_the_cycle_there(
    migrated: DatabaseSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
    chunk: int,
    after: int,
) -> None:
    with connect(migrated) as conn:
        add_fleet(conn, GPUS, T0, fresh=True)
    cfg = ScorerSection(as_of=T0.isoformat(), events=False, cycle_chunk=chunk)
    built = build_scorer(
        ScorerSettings(kafka=kafka_settings, db=migrated, topics=isolated_topics(topic_factory), scorer=cfg),
        registry=CollectorRegistry(),
    )
    loop = built.cycle
    result = loop.score_once(StopAfter(after))
    assert result is not None
    judged = min(len(GPUS), chunk * after)
    assert result.gpus == judged
    with connect(migrated) as conn:
        (stored,) = conn.execute("SELECT count(*) FROM gpu_status").fetchone() or (None,)
    assert stored == judged  # each chunk committed as it went; none after the stop
    assert loop.judged_all == (judged == len(GPUS))  # a cut-short first cycle is not a whole one

"""A chunked cycle broken off, then run again: what it concludes and what it announces, counted.

The scorer's cycle commits each chunk and then publishes that chunk's changes.
Stopped between two chunks (the loop's stop event, or SIGTERM to a real
`python -m services.scorer`), a second run must finish the job: the database
ends where one uninterrupted run ends, no alert is opened twice (counted in
gpu_alerts and on gpu-alerts), and every alert in the database was announced
exactly once, with nothing announced that the database does not hold.

While a cycle of one-GPU chunks runs, the event fast path judges GPUs the cycle
is writing, at random moments: each event's finding is one alert, once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from evaluation.pipeline import wait_until
from services.scorer.build import build_scorer
from services.scorer.event_path import EventPath
from services.scorer.ownership import Ownership
from services.scorer.rules_config import load_rules
from services.scorer.settings import ScorerSection, ScorerSettings
from shared.contract.models_health import AlertOpened, parse_alert
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from shared.store.events import insert_events
from tests.helpers.kafka import consume_all
from tests.helpers.scorer_fleet import StopAfter, add_fleet, add_xids, xid_event
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO

T0 = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
N = 24  # three hosts of eight
XIDS = (13, 31, 48, 63, 79, 94, 95, 119)


def _gpus() -> list[str]:
    return [f"GPU-{uuid.uuid4()}" for _ in range(N)]


def _fleet(conn: psycopg.Connection[Any], gpus: list[str], xids: Sequence[tuple[int, int, int]]) -> None:
    """`gpus` reporting at T0 (the scorer's tables emptied first), with (GPU index, XID, seconds ago)."""
    add_fleet(conn, gpus, T0, fresh=True)
    add_xids(conn, gpus, T0, xids)


PLACE_KINDS = ("node_fault", "rack_fault", "job_crash")  # held by one GPU of the place, its least UUID


def _concluded(conn: psycopg.Connection[Any], gpus: list[str]) -> tuple[list[tuple[Any, ...]], ...]:
    """Statuses, current verdicts and every alert row (resolved too), GPUs named by their index. A host's
    alert (node_fault) is named by its host: the GPU that holds it is the episode's least UUID, which
    differs between two fleets of random UUIDs."""
    index = {g: i for i, g in enumerate(gpus)}

    def named(uuid_: str, kind: str = "") -> tuple[str, int]:
        return ("host", index[uuid_] // 8) if kind in PLACE_KINDS else ("gpu", index[uuid_])

    rows = (
        conn.execute(query).fetchall()
        for query in (
            "SELECT gpu_uuid, state, score, action FROM gpu_status",
            "SELECT gpu_uuid, subsystem, state, rule FROM gpu_health_current",
            "SELECT gpu_uuid, kind, severity, state FROM gpu_alerts",
        )
    )
    return tuple(sorted((named(r[0], r[1] if len(r) == 4 and r[1] in PLACE_KINDS else ""), *r[1:])
                        for r in found) for found in rows)  # fmt: skip


def _opened(kafka: KafkaSettings, topic: str, gpus: list[str], expected: int) -> list[AlertOpened]:
    """The `opened` messages on `topic` for `gpus`, read until `expected` and a little after."""
    ours = set(gpus)
    found = [parse_alert(m.value() or b"") for m in consume_all(kafka, topic, expected, linger_s=1.0)]
    return [a for a in found if isinstance(a, AlertOpened) and a.gpu_uuid in ours]


def _statuses(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM gpu_status").fetchone()
    assert row is not None
    return int(row[0])


def _alert_rows(conn: psycopg.Connection[Any]) -> list[tuple[int, str, str]]:
    return [
        (int(r[0]), str(r[1]), str(r[2])) for r in conn.execute("SELECT id, gpu_uuid, kind FROM gpu_alerts")
    ]


def _announced_once(rows: list[tuple[int, str, str]], opened: list[AlertOpened]) -> None:
    """Every alert row opened once in the database and announced once; nothing announced it lacks."""
    assert max(Counter((g, k) for _, g, k in rows).values(), default=1) == 1, rows
    announced = Counter((a.alert_id, a.gpu_uuid, a.kind) for a in opened)
    assert announced == Counter(rows), (announced, rows)


def _scorer(kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, chunk: int) -> Any:
    cfg = ScorerSection(as_of=T0.isoformat(), events=False, cycle_chunk=chunk)
    settings_ = ScorerSettings(kafka=kafka, db=db, topics=topics, scorer=cfg)
    return build_scorer(settings_, registry=CollectorRegistry()).cycle


faults = st.lists(st.tuples(st.integers(0, N - 1), st.sampled_from(XIDS), st.integers(1, 3600)),
                  min_size=1, max_size=12)  # fmt: skip


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(xids=faults, chunk=st.integers(1, 9), after=st.integers(0, 6))
def test_a_cycle_stopped_between_chunks_and_run_again_ends_as_one_run_and_announces_each_alert_once(
    migrated: DatabaseSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
    xids: list[tuple[int, int, int]],
    chunk: int,
    after: int,
) -> None:
    whole_gpus, cut_gpus = _gpus(), _gpus()
    topics = isolated_topics(topic_factory)
    with connect(migrated) as conn:
        _fleet(conn, whole_gpus, xids)
        whole = _scorer(kafka_settings, migrated, topics, chunk)
        assert whole.score_once() is not None
        expected = _concluded(conn, whole_gpus)
        whole_opened = len(expected[2])

        _fleet(conn, cut_gpus, xids)
        first = _scorer(kafka_settings, migrated, topics, chunk)
        cut = first.score_once(StopAfter(after))
        assert cut is not None
        assert cut.cut_short == (after * chunk < N)
        assert first.producer.flush(10) == 0
        rerun = _scorer(kafka_settings, migrated, topics, chunk)
        again = rerun.score_once()
        assert again is not None
        assert again.gpus == N
        assert _concluded(conn, cut_gpus) == expected
        rows = _alert_rows(conn)
    for scorer in (whole, first, rerun):  # every run's announcements delivered before they are counted
        assert scorer.producer.flush(30) == 0
    opened = _opened(kafka_settings, topics.alerts, cut_gpus, 2 * whole_opened)
    _announced_once(rows, opened)


def test_sigterm_to_a_scorer_at_a_random_moment_of_its_cycle_then_a_new_run(
    migrated: DatabaseSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    """Real processes, one-GPU chunks: SIGTERM lands in the middle of a chunk, or between two."""
    rng = random.Random()
    gpus = _gpus()
    xids = [(rng.randrange(N), rng.choice(XIDS), rng.randint(1, 3600)) for _ in range(10)]
    topics = isolated_topics(topic_factory)
    env = {**os.environ, **topics_env(topics),
           "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
           "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
           "GPUHEALTH_SCORER__AS_OF": T0.isoformat(), "GPUHEALTH_SCORER__EVENTS": "false",
           "GPUHEALTH_SCORER__CYCLE_CHUNK": "1", "GPUHEALTH_SCORER__METRICS_PORT": "0"}  # fmt: skip
    with connect(migrated) as conn:
        _fleet(conn, gpus, xids)
        whole = _scorer(kafka_settings, migrated, topics, 500)
        assert whole.score_once() is not None
        expected = _concluded(conn, gpus)
        _fleet(conn, gpus, xids)

    def run(log: Path, term_when: Callable[[], bool] | None) -> int:
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "services.scorer"], cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            if term_when is not None:
                wait_until(lambda: term_when() or proc.poll() is not None, 40, "the cycle under way")
                proc.send_signal(signal.SIGTERM)
            return proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()

    stop_at = rng.randint(1, N - 2)  # GPUs with a status line when SIGTERM is sent

    def under_way() -> bool:
        with connect(migrated) as conn:
            return _statuses(conn) >= stop_at

    assert run(tmp_path / "first.log", under_way) == 0, (tmp_path / "first.log").read_text()
    with connect(migrated) as conn:
        judged = _statuses(conn)
    assert run(tmp_path / "again.log", None) == 0, (tmp_path / "again.log").read_text()
    with connect(migrated) as conn:
        assert _concluded(conn, gpus) == expected, f"stopped after {judged} of {N}"
        rows = _alert_rows(conn)
    assert whole.producer.flush(10) == 0
    # the uninterrupted run's alerts were on other rows (ids) of the same topic: only ours count
    opened = [a for a in _opened(kafka_settings, topics.alerts, gpus, 2 * len(rows))
              if a.alert_id in {r[0] for r in rows}]  # fmt: skip
    _announced_once(rows, opened)


def _event_path(kafka: KafkaSettings, db: DatabaseSettings, topics: TopicSettings, producer: JsonProducer,
                as_of: datetime) -> EventPath:  # fmt: skip
    return EventPath(
        rules=load_rules(), db=db, kafka=kafka, topic=topics.events, group=f"g-{uuid.uuid4().hex[:8]}",
        consumer_overrides={}, batch=10, producer=producer,
        publish_to={"health": topics.health, "alerts": topics.alerts}, ownership=Ownership(everything=True),
        as_of=lambda _conn, _found: as_of, lookback_s=60.0, registry=CollectorRegistry(),
    )  # fmt: skip


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hits=st.lists(st.tuples(st.integers(0, N - 1), st.sampled_from((48, 79, 95)), st.floats(0, 0.6)),
                     min_size=1, max_size=8))  # fmt: skip
def test_events_on_gpus_the_cycle_is_writing_are_each_one_alert_once(
    migrated: DatabaseSettings,
    kafka_settings: KafkaSettings,
    topic_factory: Callable[..., str],
    hits: list[tuple[int, int, float]],
) -> None:
    """A cycle of one-GPU chunks runs while the fast path judges events for its GPUs, each `delay`
    seconds into the cycle: every finding is one alert in the database, announced once."""
    gpus = _gpus()
    topics = isolated_topics(topic_factory)
    event_at = T0 + timedelta(seconds=1)
    with connect(migrated) as conn:
        _fleet(conn, gpus, [])
    cycle = _scorer(kafka_settings, migrated, topics, 1)
    fast = _event_path(kafka_settings, migrated, topics, cycle.producer, event_at)
    errors: list[BaseException] = []

    def events() -> None:
        started = time.monotonic()
        try:
            with connect(migrated) as conn:
                for i, code, delay in sorted(hits, key=lambda h: h[2]):
                    time.sleep(max(0.0, started + delay - time.monotonic()))
                    found = [xid_event(gpus[i], code, event_at)]
                    insert_events(conn, found)  # as judge_records stores what it judges
                    conn.commit()
                    fast.judge_gpus(conn, found)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=events)
    thread.start()
    assert cycle.score_once() is not None
    thread.join(30)
    assert not errors, errors
    # a cycle after the events (the as-of time of the events): it finds them, and opens nothing more
    later = _scorer(kafka_settings, migrated, topics, 1)
    later.cfg = later.cfg.model_copy(update={"as_of": event_at.isoformat()})
    assert later.score_once() is not None
    with connect(migrated) as conn:
        rows = _alert_rows(conn)
    assert later.producer.flush(10) == 0
    assert cycle.producer.flush(10) == 0
    hit = {gpus[i] for i, _, _ in hits}
    assert hit <= {g for _, g, k in rows if k.startswith("unhealthy_")}, rows
    _announced_once(rows, _opened(kafka_settings, topics.alerts, gpus, len(rows)))

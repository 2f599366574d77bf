"""shared.store.health against a migrated schema: a cycle's verdict writes and what is read back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.plumbing.errors import DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store import health
from shared.store.health import PredictionRow, StatusRow, VerdictRow
from tests.helpers.store_rows import T0, add_alert, add_gpu, gpu, on_async


def cycle(conn: psycopg.Connection[Any], as_of: datetime, memory: str, *, p30: float = 0.1) -> None:
    """One cycle's writes for GPUs 0 (memory as given) and 1 (healthy throughout)."""
    rule = None if memory == "healthy" else "dbe"
    verdicts = [
        VerdictRow(gpu(0), "memory", memory, rule, {"dbe": 1} if rule else {}, as_of),
        VerdictRow(gpu(1), "memory", "healthy", None, {}, as_of),
    ]
    statuses = [
        StatusRow(gpu(0), memory, 50.0, "C", "reset_gpu", [{"subsystem": "memory"}], as_of),
        StatusRow(gpu(1), "healthy", 100.0, "A", "none", [], as_of),
    ]
    assert health.claim_statuses(conn, statuses, health.revisions(conn)) == {gpu(0), gpu(1)}
    health.write_verdicts(
        conn,
        current=verdicts,
        changes=verdicts[:1],
        predictions=[
            PredictionRow(gpu(0), p30 / 4, p30, [{"factor": "sbe"}], as_of),
            PredictionRow(gpu(1), 0.0, 0.01, [], as_of),
        ],
    )
    conn.commit()


def test_a_cycles_writes_read_back(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> None:
    add_gpu(conn, 0, host="node-a")
    add_gpu(conn, 1, host="node-b")
    add_alert(conn, 0, kind="unhealthy_memory", severity="critical")
    cycle(conn, T0, "unhealthy")
    cycle(conn, T0 + timedelta(seconds=30), "unhealthy", p30=0.3)
    assert health.current_states(conn) == {(gpu(0), "memory"): "unhealthy", (gpu(1), "memory"): "healthy"}
    since = conn.execute("SELECT since FROM gpu_health_current WHERE gpu_uuid = %s", (gpu(0),)).fetchone()
    assert since == (T0,)  # the state did not change: it is unhealthy since the first cycle
    later = T0 + timedelta(seconds=30)
    assert sorted(health.scored_gpus(conn, [gpu(0), gpu(1), gpu(2)]), key=lambda g: g["gpu_uuid"]) == [
        {"gpu_uuid": gpu(0), "hostname": "node-a", "state": "unhealthy", "score": 50.0},
        {"gpu_uuid": gpu(1), "hostname": "node-b", "state": "healthy", "score": 100.0},
    ]
    assert health.scored_gpus(conn, [gpu(2)]) == []  # never judged
    assert health.revisions(conn) == {gpu(0): 2, gpu(1): 2}
    assert health.revisions(conn, [gpu(1), "GPU-never-judged"]) == {gpu(1): 2}
    assert health.current_states(conn, [gpu(1)]) == {(gpu(1), "memory"): "healthy"}
    assert [(p.gpu_uuid, p.p_fail_30d) for p in health.latest_predictions(conn, [gpu(0), "GPU-x"])] == [
        (gpu(0), 0.3)
    ]
    assert sorted(health.scored_subsystems(conn, [gpu(0), gpu(1)])) == [
        (gpu(0), "memory", "unhealthy"),
        (gpu(1), "memory", "healthy"),
    ]
    assert health.current_verdicts(conn, unhealthy_only=True) == [(gpu(0), "memory", "unhealthy", "dbe")]
    assert len(health.current_verdicts(conn)) == 2
    assert health.actions(conn) == {gpu(0): "reset_gpu", gpu(1): "none"}
    history, total = on_async(migrated, lambda c: health.verdict_history(c, gpu(0), limit=10, after=None))
    assert total == 2
    assert [h["time"] for h in history] == [later, T0]
    ranked, n = on_async(migrated, lambda c: health.ranked_predictions(c, min_p30=0.2, limit=10, after=None))
    assert (n, [(r["gpu_uuid"], r["p_fail_30d"]) for r in ranked]) == (1, [(gpu(0), 0.3)])  # the newest only


def test_a_status_is_written_only_over_the_revision_its_judgement_read(
    migrated: DatabaseSettings, conn: psycopg.Connection[Any]
) -> None:
    add_gpu(conn, 0, host="node-a")
    first = StatusRow(gpu(0), "healthy", 100.0, "A", "none", [], T0)
    stale = health.revisions(conn)  # {}: never judged
    assert health.claim_statuses(conn, [first], stale) == {gpu(0)}
    conn.commit()
    later = StatusRow(gpu(0), "unhealthy", 40.0, "D", "reset_gpu", [], T0 + timedelta(seconds=5))
    assert health.claim_statuses(conn, [later], stale) == set()  # judged since `stale` was read
    assert health.claim_statuses(conn, [later], health.revisions(conn)) == {gpu(0)}
    conn.commit()
    assert conn.execute("SELECT state, revision FROM gpu_status").fetchall() == [("unhealthy", 2)]
    assert health.claim_statuses(conn, [], {}) == set()


@pytest.fixture
def histories(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> DatabaseSettings:
    add_gpu(conn, 0, host="node-a")
    add_gpu(conn, 1, host="node-b")
    for minute in range(5):
        cycle(conn, T0 + timedelta(minutes=minute), "unhealthy" if minute % 2 else "healthy", p30=minute / 10)
    return migrated


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    after_time=st.datetimes(timezones=st.just(UTC)),
    after_subsystem=st.text(max_size=20),
    gpu_uuid=st.text(max_size=40) | st.just(gpu(0)),
    limit=st.integers(1, 1001),
)
def test_hostile_history_keys_page_or_refuse(
    histories: DatabaseSettings, after_time: datetime, after_subsystem: str, gpu_uuid: str, limit: int
) -> None:
    after = (after_time, after_subsystem)
    try:
        found, total = on_async(
            histories, lambda c: health.verdict_history(c, gpu_uuid, limit=limit, after=after)
        )
    except DataRefusedError:
        assert "\x00" in after_subsystem + gpu_uuid
        return
    assert total == (5 if gpu_uuid == gpu(0) else 0)
    assert all((h["time"], h["subsystem"]) < after for h in found)
    assert len(found) <= limit


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(min_p30=st.floats(0, 1), after_p=st.floats(allow_nan=False), after_gpu=st.text(max_size=40))
def test_hostile_prediction_keys_page_or_refuse(
    histories: DatabaseSettings, min_p30: float, after_p: float, after_gpu: str
) -> None:
    try:
        found, total = on_async(
            histories,
            lambda c: health.ranked_predictions(c, min_p30=min_p30, limit=5, after=(after_p, after_gpu)),
        )
    except DataRefusedError:
        assert "\x00" in after_gpu
        return
    assert total == (min_p30 <= 0.4) + (min_p30 <= 0.01)  # each GPU's newest prediction counts
    assert all((-r["p_fail_30d"], r["gpu_uuid"]) > (-after_p, after_gpu) for r in found)

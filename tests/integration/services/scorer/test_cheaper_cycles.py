"""Cheaper cycles on the real database: a cycle judges only the GPUs whose verdict can have changed.

A healthy GPU with nothing new is judged once per `rejudge_every_s`, at its own
phase, so however the cycles fall every such GPU is judged exactly once per
period and a cycle's share is the fleet's over the period's; a GPU with a
finding, an open alert, an event since its judgement, or gone silent is judged
in every cycle. What the cycles leave alone is what a full judgement would not
change.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from bench import fleets
from services.scorer.build import build_scorer
from services.scorer.cycle import judge
from services.scorer.rules_config import load_rules
from services.scorer.settings import ScorerSection, ScorerSettings
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from shared.store import judging
from tests.helpers.scorer_fleet import add_fleet
from tests.helpers.topics import isolated_topics

RULES = load_rules()
MISSING_S = RULES.availability.missing_after_s
T0 = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
GPUS = [f"GPU-{uuid.UUID(int=i)}" for i in range(40)]


def _needing(conn: psycopg.Connection[tuple[object, ...]], at: datetime, every_s: int) -> list[str]:
    return judging.needing_judgement(conn, at, None, missing_after_s=MISSING_S, late_s=300, every_s=every_s)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(every_s=st.integers(10, 120), step_s=st.integers(1, 10), start=st.integers(0, 10**6))
def test_a_healthy_gpu_with_nothing_new_is_judged_once_a_period_at_its_own_phase(
    migrated: DatabaseSettings, every_s: int, step_s: int, start: int
) -> None:
    t0 = T0 + timedelta(seconds=start)
    with connect(migrated) as conn:
        add_fleet(conn, GPUS, t0, fresh=True)
        assert _needing(conn, t0, every_s) == sorted(GPUS)  # never judged: all of them
        judge(conn, t0, RULES, predictions={})
        judged: Counter[str] = Counter()
        shares = []
        t = t0
        while t + timedelta(seconds=step_s) <= t0 + timedelta(seconds=every_s):
            t += timedelta(seconds=step_s)
            conn.execute("UPDATE gpu_latest SET time = %s", (t,))  # still reporting
            due = _needing(conn, t, every_s)
            shares.append(len(due))
            judged.update(due)
            judge(conn, t, RULES, gpus=due, predictions={})
        covered = (t - t0).total_seconds() == every_s
    # Over a whole period each GPU came due exactly once; over less, at most once.
    assert set(judged.values()) <= {1}
    if covered:
        assert set(judged) == set(GPUS)
    # The phases spread them: no cycle takes the whole fleet (40 GPUs over >= 2 cycles of a period).
    if len(shares) >= 4:
        assert max(shares) < len(GPUS)


def test_findings_alerts_events_and_silence_are_judged_every_cycle_and_agree_with_a_full_judgement(
    migrated: DatabaseSettings,
) -> None:
    degraded, warned, evented, silent, *quiet = GPUS[:12]
    with connect(migrated) as conn:
        add_fleet(conn, GPUS[:12], T0, fresh=True)
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, 'xid', 'node-0', 'mock', 'test', '{\"xid\": 13}')",
            (T0 - timedelta(seconds=30), degraded),
        )
        conn.execute("UPDATE gpu_latest SET fb_used_mib = 80000 WHERE gpu_uuid = %s", (warned,))
        conn.execute("UPDATE gpu_assets SET fb_total_mib = 81559 WHERE gpu_uuid = %s", (warned,))
        conn.commit()
        first = judge(conn, T0, RULES, predictions={})
        assert first.gpus == 12
        assert first.alerts_opened == 1  # memory pressure on a healthy GPU
        t = T0 + timedelta(seconds=1)
        conn.execute("UPDATE gpu_latest SET time = %s WHERE gpu_uuid <> %s", (t, silent))
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, 'throttle_start', 'node-0', 'mock', 'test',"
            ' \'{"reasons": ["sw_power_cap"]}\')',
            (t, evented),
        )
        conn.commit()
        due = set(_needing(conn, t, 3600))  # a long period: no phase comes round in a second
        assert due == {degraded, warned, evented}
        later = T0 + timedelta(seconds=MISSING_S + 1)
        conn.execute("UPDATE gpu_latest SET time = %s WHERE gpu_uuid <> %s", (later, silent))
        conn.commit()
        assert silent in _needing(conn, later, 3600)
        judge(conn, later, RULES, gpus=_needing(conn, later, 3600), predictions={})
        # What no cycle looked at is what a full judgement leaves as it is.
        full = judge(conn, later, RULES, predictions={})
        assert (full.verdict_changes, full.alerts_opened, full.alerts_resolved) == (0, 0, 0)
        assert quiet


def test_the_loop_judges_its_whole_share_first_then_only_what_is_due(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    with connect(migrated) as conn:
        add_fleet(conn, GPUS, T0, fresh=True)
    # `latest`: the fleet's newest sample is the time judged (the test moves it)
    cfg = ScorerSection(as_of="latest", events=False, rejudge_every_s=60, predict_every_s=3600)
    topics = isolated_topics(topic_factory)
    built = build_scorer(ScorerSettings(kafka=kafka_settings, db=migrated, topics=topics, scorer=cfg),
                         registry=CollectorRegistry())  # fmt: skip
    loop = built.cycle
    first = loop.score_once()
    assert first is not None
    assert first.gpus == len(GPUS)
    assert set(loop.predicted_at) == set(GPUS)  # predicted with their first judgement
    later = []
    with connect(migrated) as conn:
        for step in range(1, 5):
            fleets.touch_bench_fleet(conn, T0 + timedelta(seconds=15 * step))
            cycle = loop.score_once()
            assert cycle is not None
            later.append(cycle.gpus)
    assert max(later) < len(GPUS)  # a cycle takes the GPUs whose minute came round, not the fleet
    assert sum(later) == len(GPUS)  # and over the minute, each of them once
    assert loop.verdicts.states() == {"healthy": len(GPUS)}  # the gauges count the whole share

    # A fixed as-of time has no "since": each of its cycles judges the whole share.
    loop.cfg, loop.once = cfg.model_copy(update={"as_of": T0.isoformat()}), True
    assert [c.gpus for c in (loop.score_once(), loop.score_once()) if c is not None] == [len(GPUS)] * 2


def test_the_gpus_of_a_node_the_remediator_is_working_on_are_judged_every_cycle(
    migrated: DatabaseSettings,
) -> None:
    """Its validation counts their scoring cycles: judged once a minute, three healthy cycles held a
    node out three minutes after a reset that took a second (measured in `make up`, live: 194 s)."""
    with connect(migrated) as conn:
        add_fleet(conn, GPUS[:16], T0, fresh=True)  # node-0 and node-1, 8 GPUs each
        judge(conn, T0, RULES, predictions={})
        t = T0 + timedelta(seconds=1)
        conn.execute("UPDATE gpu_latest SET time = %s", (t,))
        assert _needing(conn, t, 3600) == []  # healthy, nothing new: none due within the hour
        for node, state, dry_run in [("node-0", "running", False), ("node-1", "held", False)]:
            conn.execute(
                "INSERT INTO remediations (node, gpu_uuids, action, finding, steps, state, dry_run,"
                " decision_key, created_at, updated_at, next_at) VALUES (%s, %s, 'reset_gpu', 'xid_119',"
                " ARRAY['cordon','drain','reset_gpu','validate','return'], %s, %s, %s, %s, %s, %s)",
                (node, [GPUS[0] if node == "node-0" else GPUS[8]], state, dry_run, f"k-{node}", T0, T0, T0),
            )
        conn.commit()
        # The running plan's node, every GPU of it (validation looks at them all); not a held plan's.
        assert _needing(conn, t, 3600) == sorted(GPUS[:8])
        conn.execute("UPDATE remediations SET state = 'done' WHERE node = 'node-0'")
        conn.commit()
        assert _needing(conn, t, 3600) == []

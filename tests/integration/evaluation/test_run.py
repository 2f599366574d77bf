"""Issue 16 on the real database: a small evaluation meets the targets; rates do not depend on the cadence."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from evaluation.feed import node_readings, sim_feed
from evaluation.metrics import summarise, totals
from evaluation.run import run_scenario
from evaluation.scenario import Scenario, generated_scenario, job_scenario
from services.collector.dcgm_source import parse_exposition
from services.mock_dcgm.fleet import FleetSpec
from services.scorer.features import read_features
from services.scorer.predict import precursor_features
from services.scorer.rules import evaluate
from services.scorer.rules_config import load_rules
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings

RULES = load_rules()
SEED = 201  # neither a training seed nor one of the suite's


def test_a_small_evaluation_meets_the_targets(db_settings: DatabaseSettings) -> None:
    assert SEED not in RULES.predictor.trained_on_seeds
    scenario = generated_scenario(SEED, hours=64, nodes=4, gpus_per_node=4)
    summary = summarise(run_scenario(db_settings, scenario, SEED, RULES), RULES)
    figures = totals([summary])
    assert summary.hard_faults >= 8
    assert summary.long_lead >= 2
    assert summary.hot_gpus >= 1
    assert summary.fall_off_repeats == 2
    assert summary.single_app_xids == 1
    assert summary.app_xid_bursts == 1
    # a generated scenario crashes no job: those targets have nothing to measure (None), and the job
    # scenario's own test below measures them
    jobs = {"0 GPUs escalated for a job's crash", "every job crash is one job finding"}
    measured = {name: ok for name, ok in figures["targets"].items() if name not in jobs}
    assert measured == dict.fromkeys(measured, True), figures
    assert [figures["targets"][name] for name in sorted(jobs)] == [None, None], figures["targets"]
    assert figures["cleared"] == 1.0
    assert figures["app_xid_bursts_escalated"] == 1.0
    # the remediator in dry-run beside it: it took out no healthy GPU (a target) and acted on the faults
    assert summary.hard_acted >= summary.hard_faults // 2
    assert summary.hard_cordoned >= 1
    assert summary.cordon_delays_s


@pytest.mark.parametrize("poll_s", [30, 60, 120, 300])
def test_rates_read_from_the_database_do_not_depend_on_the_poll_cadence(
    db_settings: DatabaseSettings, poll_s: int
) -> None:
    # 60 SBEs an hour, steady: at every cadence the rule reads ~60/h and stays healthy (it used
    # to read 116/h, degraded, at 120 s polls), and the predictor reads the same rate.
    scenario = Scenario(name="cadence", hours=8, nodes=1, gpus_per_node=2, seeds=[SEED])
    spec = FleetSpec(nodes=1, gpus_per_node=2, seed=SEED)
    with (
        migrated_schema(db_settings, "cadence") as db,
        sim_feed(db, spec, hours=scenario.hours, rules=RULES) as f,
    ):
        f.fleet.inject({"kind": "sbe_storm", "node": 0, "gpu": 1, "after_s": 0,
                        "params": {"rate_per_hour": 60, "growth_per_hour": 0}})  # fmt: skip
        f.advance(8 * 3600, poll_s)
        uuid = f.fleet.nodes[0].gpus[1].uuid
        as_of = datetime.fromtimestamp(f.now_s, UTC)
        with connect(db) as conn:
            g = read_features(conn, as_of, RULES)[uuid]
            raw = precursor_features(conn, as_of, RULES)[uuid]
    memory = evaluate(g, RULES, as_of)["memory"]
    assert memory.state == "healthy"
    rate = g.sbe_new * 3600 / (g.span_long_s or 1)
    assert 55 <= rate <= 65, rate
    assert 55 <= raw["sbe_per_hour"] <= 65, raw
    assert raw["sbe_growth_per_hour"] < 5


def test_the_feeds_shortcut_reads_what_the_exposition_parser_reads(db_settings: DatabaseSettings) -> None:
    spec = FleetSpec(nodes=4, gpus_per_node=2, seed=SEED)
    with sim_feed(db_settings, spec, hours=3, rules=RULES) as f:
        f.fleet.inject({"kind": "remapped_rows", "node": 0, "gpu": 1, "after_s": 60})
        f.fleet.inject({"kind": "retired_pages", "node": 3, "gpu": 0, "after_s": 60})
        f.fleet.inject({"kind": "fall_off_bus", "node": 2, "gpu": 0, "after_s": 60})
        for hours in (0.5, 2.0):
            f.hand.t = hours * 3600
            for i, node in enumerate(f.fleet.nodes):
                text, _ = f.fleet.scrape(i, timestamps=True)
                at = datetime.fromtimestamp(int(f.now_s * 1000) / 1000, UTC)
                parsed = parse_exposition(text, scraped_at=at)
                direct = node_readings(node, driver_version=f.fleet.spec.driver_version, at=at)
                assert direct == parsed


def test_a_jobs_crash_escalates_none_of_its_gpus_and_each_shared_fault_is_one_finding(
    db_settings: DatabaseSettings,
) -> None:
    """The default suite's job scenario (evaluation/shared_faults.py): job crashes on one host, across
    two hosts and repeated, a lone application XID, a node fault and a rack fault."""
    summary = summarise(run_scenario(db_settings, job_scenario(SEED), SEED, RULES), RULES)
    figures = totals([summary])
    job, node, rack = (figures["shared"][k] for k in ("job", "node", "rack"))
    assert (job.faults, job.gpus) == (9, 56)
    assert job.escalated == 0, summary.misses
    assert job.blamed == 0, summary.misses
    assert job.one_finding == job.faults, summary.misses
    assert (node.faults, node.one_finding, node.escalated) == (1, 1, 0), summary.misses
    assert (rack.faults, rack.one_finding, rack.escalated) == (1, 1, 0), summary.misses
    assert summary.false_degraded == 0  # a job's crash leaves its GPUs healthy
    assert summary.single_app_xids == 1  # the lone application XID beside them is still its GPU's
    assert all(ok is not False for ok in figures["targets"].values()), figures["targets"]

"""The evaluation's figures on hand-built runs: they catch relabelling, late predictions, stuck verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluation.metrics import calibration, summarise, totals
from evaluation.run import Record
from evaluation.scenario import ScenarioError, generated_scenario, load_scenario
from services.scorer.rules_config import load_rules
from tests.paths import REPO

RULES = load_rules()
H = 3_600_000
FAILING, HEALTHY, HOT, BLIP = "GPU-fail", "GPU-ok", "GPU-hot", "GPU-blip"


def fault(gpu: str, kind: str, start_h: float, **kw: Any) -> dict[str, Any]:
    sub = {"dbe": "memory", "sbe_storm": "memory", "xid": "xid", "heavy_workload": None}[kind]
    return {"gpu_uuid": gpu, "kind": kind, "subsystem": sub, "start_ms": int(start_h * H), "end_ms": None,
            "hard_failure": kind == "dbe", "precursor": kind == "sbe_storm", "params": {}, **kw}  # fmt: skip


def record(predictions: list[tuple[float, dict[str, float]]], detect_h: float) -> Record:
    faults = [
        fault(FAILING, "sbe_storm", 1.0),
        fault(FAILING, "dbe", 60.02),
        fault(HOT, "heavy_workload", 0.0),
        fault(BLIP, "xid", 10.01, end_ms=int(10.1 * H), params={"code": 13}),
    ]
    truth = {"faults": faults, "failures": {FAILING: {"failure_ms": int(60.02 * H), "precursor_start_ms": H}}}
    rec = Record(scenario="t", seed=1, poll_s=120, score_every_s=300, end_ms=72 * H, truth=truth,
                 gpus=[FAILING, HEALTHY, HOT, BLIP])  # fmt: skip
    t = 0
    while t <= 72 * H:
        states: dict[str, dict[str, str]] = {}
        actions = {g: "none" for g in rec.gpus}
        if t >= detect_h * H:
            states[FAILING] = {"memory": "unhealthy"}
            actions[FAILING] = "reset_gpu"
        if 10.01 * H <= t < 11.1 * H:
            states[BLIP] = {"xid": "degraded"}
            actions[BLIP] = "restart_workload"
        rec.cycles.append((t, states, actions))
        t += 300_000
    rec.predictions = [(int(h * H), p) for h, p in predictions]
    return rec


def test_a_detection_one_cycle_late_and_a_prediction_after_the_failure_are_caught() -> None:
    late = summarise(record([(61.0, {FAILING: 0.9})], detect_h=60.5), RULES)
    assert (late.hard_faults, late.hard_within_cycle) == (1, 0)
    assert late.with_precursor_predicted == 0
    assert late.predicted == 0
    good = summarise(record([(20.0, {FAILING: 0.9, HEALTHY: 0.01, HOT: 0.02})], detect_h=60.03), RULES)
    assert (good.hard_within_cycle, good.predicted, good.true_predicted) == (1, 1, 1)
    assert good.long_leads_h == [pytest.approx(40.02)]
    assert (good.healthy_gpus, good.hot_gpus, good.false_unhealthy) == (2, 1, 0)
    assert good.healthy_p30_max == pytest.approx(0.02)
    assert (good.ended_faults, good.cleared) == (1, 1)  # the XID 13 aged out after its hour
    assert (good.single_app_xids, good.single_app_xid_past_restart) == (1, 0)


def test_a_false_alarm_on_a_hot_gpu_and_a_stuck_verdict_are_counted() -> None:
    rec = record([(20.0, {HOT: 0.6})], detect_h=60.03)
    for t, states, actions in rec.cycles:
        if t >= 30 * H:
            states[HOT] = {"thermal": "unhealthy"}
        if t >= 10.01 * H:  # never clears, and escalates
            states[BLIP] = {"xid": "degraded"}
            actions[BLIP] = "reset_gpu"
    s = summarise(rec, RULES)
    assert (s.false_unhealthy, s.hot_unhealthy, s.predicted, s.true_predicted) == (1, 1, 1, 0)
    assert (s.ended_faults, s.cleared) == (1, 0)
    assert s.single_app_xid_past_restart == 1
    figures = totals([s])
    assert figures["precision"] == 0.0
    assert not figures["targets"]["0 unhealthy on healthy GPUs, hot included"]
    assert not figures["targets"]["a single application XID stays at restart_workload"]


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 1)), min_size=1, max_size=200))
def test_calibration_is_a_proper_brier_score_and_its_table_accounts_for_every_prediction(
    pairs: list[tuple[float, int]],
) -> None:
    cal = calibration(pairs)
    assert 0 <= cal["brier"] <= 1
    assert sum(row["n"] for row in cal["table"]) == len(pairs)
    for row in cal["table"]:
        assert 0 <= row["observed"] <= 1


def test_the_generated_suite_covers_every_model_precursors_repeats_and_hot_gpus() -> None:
    s = generated_scenario(101)
    kinds = [f["kind"] for f in s.faults]
    assert {
        "sbe_storm",
        "pcie_replay_storm",
        "thermal_creep",
        "heavy_workload",
        "fall_off_bus",
        "xid",
    } <= set(kinds)
    assert {"remapped_rows", "retired_pages"} & set(kinds)
    nodes_with_faults = {f["node"] % len(s.models) for f in s.faults}
    assert nodes_with_faults == set(range(len(s.models)))  # a fault on every model
    assert all(f["after_s"] % 60 != 0 for f in s.faults if f["kind"] != "heavy_workload")  # off the grid
    assert s.hours >= 48
    assert generated_scenario(101).faults == s.faults
    per_gpu: dict[tuple[int, int], int] = {}
    for f in s.faults:
        per_gpu[(f["node"], f["gpu"])] = per_gpu.get((f["node"], f["gpu"]), 0) + 1
    assert max(per_gpu.values()) >= 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "expected an object"),
        ('{"faults": [], "oops": 1}', "unknown fields"),
        ('{"hours": -1}', "hours"),
        ('{"hours": "72"}', "numbers"),
        ('{"poll_s": 600, "score_every_s": 60}', "poll_s"),
        ('{"models": ["tpu"]}', "known models"),
        ('{"seeds": []}', "seeds"),
        ('{"faults": [1]}', "every fault"),
        ("{not json", "scenario"),
    ],
)
def test_malformed_scenario_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_a_written_scenario_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "suite.json"
    path.write_text(generated_scenario(7, hours=50).to_json())
    again = load_scenario(path)
    assert again.faults == json.loads(path.read_text())["faults"]
    assert again.hours == 50


def test_the_committed_scenario_file_loads_with_every_model_and_its_failures() -> None:
    path = REPO / "evaluation" / "scenarios" / "precursors-and-repeats.json"
    s = load_scenario(path)
    assert s.hours >= 48
    assert len(s.seeds) >= 2
    assert {f["node"] % len(s.models) for f in s.faults} == set(range(len(s.models)))


def plan(gpus: list[str], decided_h: float, cordoned_h: float | None, state: str = "done") -> dict[str, Any]:
    def ms(h: float | None) -> int | None:
        return None if h is None else int(h * H)

    times = {"decided_ms": ms(decided_h), "cordoned_ms": ms(cordoned_h), "drained_ms": ms(cordoned_h)}
    return {"gpus": gpus, "node": "n", "action": "reset_gpu", "state": state, "held_for": None, **times}


def test_the_remediators_plans_are_scored_against_the_truth() -> None:
    rec = record([], detect_h=60.03)
    rec.remediations = [
        plan([FAILING], 60.03, 60.05),  # the DBE acted on, cordoned 0.03 h after it came
        plan([HOT], 5.0, 5.0),  # a hot but healthy GPU's node taken out: a false cordon
        plan([BLIP], 10.02, None, state="held"),  # held: decided, not cordoned
    ]
    s = summarise(rec, RULES)
    assert (s.plans, s.healthy_cordoned, s.hard_acted, s.hard_cordoned) == (3, 1, 1, 1)
    assert s.cordon_delays_s == pytest.approx([0.03 * 3600], abs=1)
    assert any("GPU-hot: its node cordoned" in m for m in s.misses)
    total = totals([s])
    assert total["healthy_gpus_cordoned"] == 1
    assert total["targets"]["the remediator takes out no healthy GPU"] is False
    rec.remediations = [plan([FAILING], 59.0, None, state="done")]  # a plan over before the fault
    assert summarise(rec, RULES).hard_acted == 0

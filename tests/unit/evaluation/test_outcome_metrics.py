"""The outcome accounting (evaluation/outcome_metrics.py): timelines told by hand, and their figures."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluation.outcome_arm import replay
from evaluation.outcome_metrics import (
    ClassFigures,
    Incident,
    Timeline,
    back_at,
    figures,
    node_hours,
    percentile,
    remedy_outcomes,
)
from evaluation.outcome_world import OutcomeScenario, add_working_hours, outcome_scenario
from evaluation.outcomes import ArmResult, load_results, merged, render, targets
from evaluation.scenario import Scenario

MIN = 60.0
H = 3600.0
CLASSES = ("reset", "persistent", "job")


def told(**fields: object) -> Timeline:
    base: dict[str, object] = {"arm": "t", "start_s": 0.0, "end_s": 48 * H, "incidents": []}
    return Timeline(**{**base, **fields})  # type: ignore[arg-type]


def test_a_reset_fixed_by_the_remediator_is_back_automatically_and_its_minutes_counted() -> None:
    fault = Incident(1, "reset", ("n0",), 100.0, [(100.0, 400.0)])  # the reset ended it at 400 s
    t = told(incidents=[fault], out={"n0": [(200.0, 100.0 + 9 * MIN, "remediator")]},
             evictions=[(230.0, "n0", 2, 1)], faults_by_node={"n0": [(100.0, 400.0)]})  # fmt: skip
    x = figures(t, CLASSES)["reset"]
    assert (x.faults, x.automatic, x.within_15min, x.never_back) == (1, 1, 1, 0)
    assert x.out_s == [9 * MIN]
    assert (x.pods, x.jobs, x.people, x.healthy_out, x.faulty_returns) == (2, 1, 0, 0, 0)
    assert node_hours(t) == pytest.approx((100.0 + 9 * MIN - 100.0) / H)


def test_a_visit_makes_a_return_not_automatic_and_a_fault_never_over_is_never_back() -> None:
    fixed = Incident(1, "persistent", ("n0",), 0.0, [(0.0, 5 * H)])
    stuck = Incident(2, "persistent", ("n1",), H, [(H, None)])
    t = told(incidents=[fixed, stuck],
             out={"n0": [(60.0, 5 * H, "person")], "n1": [(H + 60, None, None)]},
             visits=[(3 * H, "n0", "visit"), (4 * H, "n1", "approve")],
             faults_by_node={"n0": [(0.0, 5 * H)], "n1": [(H, None)]})  # fmt: skip
    x = figures(t, CLASSES)["persistent"]
    assert (x.faults, x.automatic, x.never_back, x.people) == (2, 0, 1, 2)
    assert sorted(x.out_s) == [5 * H, 47 * H]  # the one never back counts to the run's end
    assert node_hours(t) == pytest.approx(5 + 47)


def test_a_return_while_still_faulty_and_a_healthy_node_taken_out_are_charged_to_their_class() -> None:
    crash = Incident(1, "job", ("n0",), 0.0, [(0.0, 300.0)])  # a job's XIDs: the GPUs are fine
    reset = Incident(2, "reset", ("n1",), H, [(H, 3 * H)])
    t = told(incidents=[crash, reset],
             out={"n0": [(120.0, 900.0, "remediator")], "n1": [(H + 60, 2 * H, "remediator")]},
             faulty_returns=[(2 * H, "n1")], faults_by_node={"n1": [(H, 3 * H)]})  # fmt: skip
    got = figures(t, CLASSES)
    assert (got["job"].healthy_out, got["job"].faulty_returns) == (1, 0)
    assert (got["reset"].healthy_out, got["reset"].faulty_returns) == (0, 1)
    assert got["reset"].out_s == [2 * H]  # back only once the fault was over, at 3 h
    assert got["job"].out_s == [900.0]  # the cordon kept the job's node out until 900 s


def test_what_no_incident_explains_goes_to_none() -> None:
    t = told(out={"n5": [(10.0, 20.0, "remediator")]}, evictions=[(12.0, "n5", 3, 3)])
    x = figures(t, CLASSES)["none"]
    assert (x.healthy_out, x.pods, x.faults) == (1, 3, 0)


@given(
    spans=st.lists(
        st.tuples(st.floats(0, 40 * H), st.floats(0, 10 * H)).map(lambda p: (p[0], p[0] + p[1])), max_size=6
    ),
    faults=st.lists(
        st.tuples(st.floats(0, 40 * H), st.floats(0, 10 * H)).map(lambda p: (p[0], p[0] + p[1])), max_size=6
    ),
)
def test_node_hours_are_the_union_of_cordons_and_faults_never_more_than_the_run(
    spans: list[tuple[float, float]], faults: list[tuple[float, float]]
) -> None:
    t = told(out={"n0": [(a, b, "x") for a, b in spans]}, faults_by_node={"n0": list(faults)})
    hours = node_hours(t)
    assert 0 <= hours <= 48 + 1e-9
    longest = max([min(b, t.end_s) - a for a, b in [*spans, *faults]], default=0.0)  # up to the run's end
    assert hours >= longest / H - 1e-9
    assert hours <= sum(b - a for a, b in [*spans, *faults]) / H + 1e-9


def test_back_waits_for_every_cordon_that_covers_it() -> None:
    fault = Incident(1, "reset", ("n0",), 0.0, [(0.0, 100.0)])
    t = told(incidents=[fault], out={"n0": [(50.0, 200.0, "remediator"), (200.0, 500.0, "remediator")]})
    assert back_at(t, fault) == 500.0


def test_percentile_is_a_value_some_fault_had() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    assert percentile([5.0], 0.5) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_a_person_acts_within_working_hours() -> None:
    friday_6pm = datetime(2026, 11, 27, 18, tzinfo=UTC).timestamp()
    monday_11am = datetime(2026, 11, 30, 11, tzinfo=UTC).timestamp()
    assert add_working_hours(friday_6pm, 2) == monday_11am
    tuesday_4pm = datetime(2026, 11, 24, 16, tzinfo=UTC).timestamp()
    assert add_working_hours(tuesday_4pm, 4) == datetime(2026, 11, 25, 12, tzinfo=UTC).timestamp()


def test_the_mix_has_every_class_on_nodes_that_can_have_it() -> None:
    oscen = outcome_scenario(301)
    assert set(oscen.classes) == {"reset", "reboot", "persistent", "flaky", "job", "place"}
    for fault, cls in zip(oscen.scenario.faults, oscen.classes, strict=True):
        if fault["kind"] == "row_remap_failure":
            assert fault["node"] % 4 != 3, "the V100 node remaps no rows"
        assert fault["after_s"] < (oscen.scenario.hours - 23) * H, cls
    assert outcome_scenario(301).scenario.faults == oscen.scenario.faults


def small(faults: list[dict[str, object]], classes: list[str], hours: float = 30.0) -> OutcomeScenario:
    scenario = Scenario(name="small", hours=hours, nodes=2, gpus_per_node=2, seeds=[7], faults=faults)
    return OutcomeScenario(scenario, classes, list(range(len(faults))))  # type: ignore[arg-type]


MONDAY = datetime(2026, 11, 2, tzinfo=UTC).timestamp() + 17.5  # a Monday, 00:00:17.5 UTC


def test_no_automation_waits_for_a_person_who_does_what_the_truth_needs() -> None:
    oscen = small(
        [{"kind": "xid", "node": 0, "gpu": 0, "after_s": 3600, "params": {"code": 119}},
         {"kind": "row_remap_failure", "node": 1, "gpu": 1, "after_s": 7200}],
        ["reset", "persistent"],
    )  # fmt: skip
    t = replay("no automation", oscen, 7, MONDAY)
    got = figures(t, CLASSES)
    reset, persistent = got["reset"], got["persistent"]
    assert (reset.faults, reset.automatic, reset.people, reset.never_back) == (1, 0, 1, 0)
    assert (persistent.faults, persistent.automatic, persistent.people) == (1, 0, 1)
    (visit_reset,) = [at for at, node, _ in t.visits if node == "gpu-node-00"]
    assert MONDAY + 9 * H - 17.5 <= visit_reset <= MONDAY + 13 * H  # within 4 working hours of 01:00 Monday
    assert reset.out_s == [pytest.approx(visit_reset + 600 - (MONDAY + 3600))]  # a reset takes 10 min
    (visit_repair,) = [at for at, node, _ in t.visits if node == "gpu-node-01"]
    assert persistent.out_s == [pytest.approx(visit_repair + 7200 - (MONDAY + 7200))]  # a repair takes 2 h
    assert t.faulty_returns == []
    assert node_hours(t) == pytest.approx(sum(reset.out_s + persistent.out_s) / H)


def test_a_flaky_fault_that_comes_back_is_a_fault_of_its_own_and_a_persistent_one_is_not() -> None:
    oscen = small(
        [{"kind": "xid", "node": 0, "gpu": 0, "after_s": 3600, "params": {"code": 119}, "recur_after_s": 3600,
          "recur_probability": 1},
         {"kind": "fall_off_bus", "node": 1, "gpu": 0, "after_s": 3600, "recur_after_s": 600,
          "recur_probability": 1}],
        ["flaky", "persistent"], hours=60,
    )  # fmt: skip
    t = replay("no automation", oscen, 7, MONDAY)
    got = figures(t, CLASSES)
    assert got["flaky"].faults >= 2  # back an hour after each reset: a fault each time
    assert got["persistent"].faults == 1  # the same broken GPU, however often it falls off


def test_remedy_outcomes_count_a_reset_that_held_and_one_that_did_not() -> None:
    def reset(at_h: float, gpu: str, *, held: bool) -> dict[str, object]:
        came_back = [] if held else [{"fault": 2}]
        return {"remedy": "reset_gpu", "ok": True, "time_ms": int(at_h * H * 1000), "gpu_uuids": [gpu],
                "faults_ended": [1], "faults_left": [], "recurrences": came_back}  # fmt: skip

    incident = Incident(1, "reset", ("n0",), 0.0, [(0.0, 300.0)])
    t = told(incidents=[incident], out={"n0": [(60.0, 600.0, "remediator")]},
             remedies=[reset(1, "GPU-a", held=False), reset(2, "GPU-a", held=True),
                       reset(3, "GPU-b", held=True),
                       {"remedy": "reboot_node", "ok": True, "time_ms": 0, "gpu_uuids": ["GPU-c"],
                        "faults_ended": [3], "faults_left": [], "recurrences": []}])  # fmt: skip
    seen = remedy_outcomes(t)
    assert seen == {"reset_fix_probability": 0.5, "reset_fix_probability_after_reset": 1.0,
                    "reset_downtime_h": pytest.approx(600 / H)}  # fmt: skip


def test_the_targets_and_the_table_read_the_figures(tmp_path: Path) -> None:
    def arm(name: str, reset: ClassFigures, hours: float) -> ArmResult:
        return ArmResult(name, 301, {"reset": reset}, hours, 1.0, {"reset_fix_probability": 0.9})

    good = ClassFigures(faults=20, automatic=20, within_15min=19, out_s=[300.0] * 20)
    slow = ClassFigures(faults=20, automatic=20, within_15min=18, out_s=[300.0] * 20)
    base = ClassFigures(faults=20, out_s=[36000.0] * 20, people=20)
    results = [arm("remediator", good, 10.0), arm("loop open", base, 50.0),
               arm("cordon-and-wait", base, 80.0), arm("no automation", base, 100.0)]  # fmt: skip
    assert all(targets(merged(results)).values())
    missed = targets(merged([arm("remediator", slow, 26.0), *results[1:]]))
    assert list(missed.values()) == [False, True, False]  # 18 of 20 within 15 min; 26 % of the node-hours
    path = tmp_path / "results.json"
    path.write_text(json.dumps([asdict(r) for r in results]))
    again = load_results(path)
    assert again == results
    table = render(again)
    assert "[ok] >= 95 % of reset-fixable faults" in table
    assert "reset_fix_probability" in table


def test_a_cordon_between_the_falls_of_a_gpu_that_keeps_falling_off_is_not_of_a_healthy_node() -> None:
    falls = Incident(1, "persistent", ("n0",), 0.0, [(0.0, 600.0), (1200.0, 1800.0), (2400.0, 5000.0)])
    t = told(incidents=[falls], out={"n0": [(60.0, 900.0, "remediator"), (1000.0, 1300.0, "remediator"),
                                            (6000.0, 6100.0, "remediator")]},
             faults_by_node={"n0": falls.faults})  # fmt: skip
    got = figures(t, CLASSES)
    # the first two cordons fall within the broken GPU's incident (between its falls); the third, past its
    # return at 5000 s, took a healthy node out
    assert (got["persistent"].healthy_out, got["none"].healthy_out) == (1, 0)

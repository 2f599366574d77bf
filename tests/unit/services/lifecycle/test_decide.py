"""The steps `resolve` runs, one by one: each input from its source, or assumed and listed as missing."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.lifecycle import decide as d
from services.lifecycle.calibration import Bin, Calibration
from services.lifecycle.costs import Situation
from services.lifecycle.inventory import InventoryEntry
from services.lifecycle.settings import EconomicsSection
from tests.helpers.lifecycle import TODAY, bought, busy

E = EconomicsSection()
P0 = 0.031
CAL = Calibration("cal.toml", (Bin(0.0, 0.1, 100, 3, 0.03), Bin(0.1, 0.6, 50, 10, 0.2)), "digest")
BARE = d.GpuFacts("GPU-0")  # nothing known of it


def known(facts: d.GpuFacts, calibration: Calibration | None = None, **so_far: Any) -> d.Known:
    return d.Known(facts, E, TODAY, P0, calibration, so_far)


def said(found: d.Found) -> list[tuple[str, Any, str]]:
    return [(t.name, t.value, t.source) for t in found.terms]


def test_the_prediction_is_the_score_without_a_calibration_and_calibrated_with_one() -> None:
    raw = d.prediction(known(busy(0.05, None)))
    assert said(raw)[0] == ("p_fail_30d_score", 0.05, "predictor")
    assert said(raw)[2] == ("p_fail_30d", 0.05, "predictor")
    assert raw.values == {"p30": 0.05}
    assert raw.no_p is None
    calibrated = d.prediction(known(busy(0.05, None), CAL))
    assert said(calibrated)[2] == ("p_fail_30d", 0.03, "calibration")
    assert calibrated.values == {"p30": 0.03}
    assert calibrated.no_p is None


def test_no_prediction_or_no_support_leaves_p30_unknown_and_says_why() -> None:
    none = d.prediction(known(BARE))
    assert none.terms == ()
    assert none.values == {"p30": None}
    assert none.no_p == "no failure prediction for this GPU (too little history)"
    unsupported = d.prediction(known(busy(0.9, None), CAL))
    assert unsupported.values == {"p30": None}
    assert unsupported.no_p is not None
    assert "no support for score 0.9" in unsupported.no_p
    assert [t.name for t in unsupported.terms] == ["p_fail_30d_score", "calibration"]


def test_a_failed_gpu_a_reset_may_fix_is_priced_at_the_baseline_only_without_a_p30() -> None:
    failed = dataclasses.replace(BARE, failed=True, finding="reset_gpu")
    found = d.unconfirmed_fault(known(failed, p30=None))
    assert found.values == {"p30": P0}
    assert said(found) == [("p_fail_30d", P0, "assumption")]
    assert [(u.field, u.gap.low, u.gap.high) for u in found.unknown] == [("p30", 0.0, 1.0)]
    assert d.unconfirmed_fault(known(failed, p30=0.2)) == d.Found()
    assert d.unconfirmed_fault(known(dataclasses.replace(failed, finding="rma"), p30=None)) == d.Found()
    assert d.unconfirmed_fault(known(dataclasses.replace(failed, failed=False), p30=None)) == d.Found()


def test_the_verdict_is_the_scorers() -> None:
    found = d.verdict(known(dataclasses.replace(BARE, failed=True, finding="rma")))
    assert said(found) == [("failed", True, "scorer"), ("finding", "rma", "scorer")]
    assert found.values == {"failed": True, "finding": "rma"}


def test_each_simple_input_is_taken_from_its_source_else_assumed_and_listed() -> None:
    facts = busy(0.05, bought(warranty_days=100, spares=2, age_days=730, price=25_000))
    cases = [  # step, its known value and source, what it assumes, its range's ends
        (d.utilisation, 0.9, "metrics", 0.5, (0.0, 1.0)),
        (d.power, 700.0, "metrics", 400.0, (0.0, 1000.0)),
        (d.work, "training", "workload", "training", ("idle", "inference")),
        (d.resets, 0, "remediation", 0, (0, 1)),
        (d.warranty, 100.0, "inventory", 0.0, (0.0, E.horizon_days)),
        (d.rma_turnaround, 21, "inventory", E.rma_turnaround_days_when_unknown, (7.0, 60.0)),
        (d.spares, True, "inventory", False, (False, True)),
        (d.purchase_price, 25_000, "inventory", E.replacement_price, (0.0, 2 * E.replacement_price)),
        (d.age, round(730 / 365.25, 3), "inventory", E.useful_life_years / 2, (0.0, E.useful_life_years)),
    ]
    for step, value, source, assumed, ends in cases:
        have, lack = step(known(facts)), step(known(BARE))
        (name,) = have.values
        assert said(have) == [(name, value, source)], step
        assert have.values == {name: value}, step
        assert have.unknown == (), step
        assert lack.values == {name: assumed}, step
        assert said(lack) == [(name, assumed, "assumption")], step
        (u,) = lack.unknown
        assert (u.field, u.gap.assumed, (u.gap.low, u.gap.high)) == (name, assumed, ends), step


def test_an_input_of_the_inventory_says_when_the_gpu_has_no_row() -> None:
    no_row = [d.warranty, d.rma_turnaround, d.spares, d.purchase_price, d.age]
    for step in no_row:
        assert step(known(BARE)).unknown[0].gap.label.endswith(" (the GPU has no inventory row)"), step
        empty = step(known(busy(None, InventoryEntry(line=2, serial="s", gpu_uuid=None))))
        assert "no inventory row" not in empty.unknown[0].gap.label, step


def test_the_gpus_of_its_job_are_asked_only_of_training() -> None:
    n = E.job_gpus_when_unknown
    assert d.job_gpus(known(BARE, work="inference")) == d.Found(values={"job_gpus": None})
    assert d.job_gpus(known(busy(None, None), work="training")).values == {"job_gpus": 8}
    lack = d.job_gpus(known(BARE, work="training"))
    assert lack.values == {"job_gpus": n}
    assert [(u.field, u.gap.low, u.gap.high) for u in lack.unknown] == [("job_gpus", 1, n * 16)]


def test_the_steps_set_every_field_of_the_situation_and_list_terms_in_their_order() -> None:
    values: dict[str, Any] = {}
    for step in d.STEPS:
        values.update(step(known(BARE, **values)).values)
    assert set(values) == {f.name for f in dataclasses.fields(Situation)}
    s, terms, unknown, no_p = d.resolve(busy(0.05, bought(warranty_days=10)), E, TODAY, P0, None)
    assert [t.name for t in terms][:5] == [
        "p_fail_30d_score",
        "calibration",
        "p_fail_30d",
        "failed",
        "finding",
    ]
    assert s.p30 == 0.05
    assert s.job_gpus == 8
    assert s.warranty_days_left == 10.0
    assert no_p is None
    assert unknown == []

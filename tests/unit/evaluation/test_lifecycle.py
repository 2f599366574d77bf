"""The lifecycle evaluation's world and its policies' bookkeeping, on small fleets."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from evaluation.calibrate import HELD_OUT_SEEDS, TRAIN_SEEDS
from evaluation.lifecycle import RUNS, SEEDS, figures, render, run
from evaluation.lifecycle_sim import POLICIES, Place, Simulation, committed_predictor
from evaluation.lifecycle_world import Shape, fleet, incarnation
from services.lifecycle.calibration import load_calibration
from services.lifecycle.settings import PREDICTOR_CALIBRATION_FILE, PREDICTOR_WEIGHTS_FILE, EconomicsSection
from services.scorer.rules_config import load_rules

WEIGHTS = load_rules().predictor
BASELINE = 1 / (1 + math.exp(-WEIGHTS.intercept))
SMALL = Shape(gpus=24, days=90, tail_days=30, spares=1)
E = EconomicsSection()


def simulation(policy: str, seed: int = 7, shape: Shape = SMALL) -> Simulation:
    predictor = committed_predictor(WEIGHTS)
    return Simulation(seed, policy, shape, E, predictor, BASELINE, calibration=None)  # type: ignore[arg-type]


def test_a_seed_is_one_fleet_and_each_gpu_its_own_fate() -> None:
    assert fleet(7, SMALL) == fleet(7, SMALL)
    assert fleet(7, SMALL) != fleet(8, SMALL)
    one = incarnation(7, 3, 0, installed=0.0, age_years=1.0, shape=SMALL)
    again = incarnation(7, 3, 0, installed=0.0, age_years=1.0, shape=SMALL)
    assert (one.onset, one.death, one.stuck, one.benign) == (
        again.onset,
        again.death,
        again.stuck,
        again.benign,
    )
    assert [one.observed(d) for d in range(60)] == [again.observed(d) for d in range(60)]
    assert incarnation(7, 4, 0, installed=0.0, age_years=1.0, shape=SMALL).key != one.key


def test_a_wearing_gpu_shows_its_precursor_growing_before_it_dies_and_nothing_after() -> None:
    shape = Shape(gpus=1, days=3000, tail_days=0)
    g = next(
        g for n in range(500) if (g := incarnation(1, 0, n, installed=0.0, age_years=4.0, shape=shape)).wear
    )
    days = range(math.ceil(g.onset), math.floor(g.death))
    seen = [g.observed(d).get(g.channel, 0.0) for d in days]
    assert max(seen) > 0
    assert seen.index(max(seen)) > len(seen) / 3  # it grows towards the end
    assert g.channel not in g.observed(math.ceil(g.death) + 1) or g.benign


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_its_books(policy: str) -> None:
    ledger = simulation(policy, shape=replace(SMALL, gpus=64)).run()
    c = ledger.count
    assert c["sent_back"] == c["sent_failed"] + c["sent_would_fail"] + c["sent_no_fault"]
    assert all(v >= 0 for v in ledger.cost.values())
    assert ledger.total == pytest.approx(sum(ledger.cost.values()))
    if policy == "run_to_failure":  # it never sends a GPU that has not failed or stuck
        assert c["sent_would_fail"] == 0
        assert c["repurposed"] == c["retired"] == 0


def test_the_same_fleet_is_the_same_for_every_policy_until_one_acts() -> None:
    """Common random numbers: the GPUs a policy leaves alone fail at the same moments under every policy."""
    rtf, first = simulation("run_to_failure"), simulation("first_hard_error")
    assert [p.gpu.key for p in rtf.places] == [p.gpu.key for p in first.places]
    assert [p.gpu.death for p in rtf.places] == [p.gpu.death for p in first.places]


def _place(sim: Simulation, *, defective: bool) -> Place:
    p = sim.places[0]
    p.gpu.onset, p.gpu.death = (0.0, 50.0) if defective else (math.inf, math.inf)
    return p


def test_the_vendor_finds_what_is_there_and_charges_for_what_is_not() -> None:
    sim = simulation("run_to_failure")
    healthy = _place(sim, defective=False)
    under = healthy.slot.warranty_days_left(sim.shape, 10.0) > 0
    sim.send_back(healthy, 10.0)
    assert sim.ledger.count["sent_no_fault"] == 1
    assert sim.ledger.cost["no_fault_found"] == E.no_fault_found_cost
    assert healthy.state == "away"
    assert healthy.returning is not None
    assert healthy.returning.key == healthy.gpu.key or sim.shape.spares  # no fault: the same GPU comes back
    sim2 = simulation("run_to_failure")
    worn = _place(sim2, defective=True)
    sim2.send_back(worn, 10.0)
    assert sim2.ledger.count["sent_would_fail"] == 1
    assert sim2.ledger.cost["repairs"] == (0 if under else E.repair_cost_fraction * worn.slot.price)


def test_a_reseat_costs_a_visit_and_may_bring_a_stuck_gpu_back() -> None:
    sim = simulation("run_to_failure")
    p = sim.places[0]
    p.state = "stuck"
    sim.reset(p, 5.0, reseat=True)
    assert sim.ledger.cost["visits"] == E.technician_visit_cost
    assert sim.ledger.count["reseats"] == 1
    assert p.resets == [5.0]
    assert p.state in ("serving", "stuck")


def test_the_engine_as_shipped_is_never_evaluated_on_a_seed_that_fitted_or_tested_its_calibration() -> None:
    assert not set(SEEDS) & (set(TRAIN_SEEDS) | set(HELD_OUT_SEEDS))
    calibration = load_calibration(PREDICTOR_CALIBRATION_FILE, weights_file=PREDICTOR_WEIGHTS_FILE)
    with pytest.raises(ValueError, match=r"seeds \[101\] fitted or tested the calibration"):
        run((201, 101), SMALL, E, calibration)


def test_the_report_names_every_row_its_savings_and_the_predictors_calibration() -> None:
    calibration = load_calibration(PREDICTOR_CALIBRATION_FILE, weights_file=PREDICTOR_WEIGHTS_FILE)
    results = run((1, 2), SMALL, E, calibration)
    text = render({**figures(results, calibration), "calibration_file": calibration.name}, SMALL, (1, 2))
    for name, _, _ in RUNS:
        assert name in text
    assert "saving of engine vs run_to_failure" in text
    assert "saving of engine vs engine, no prediction" in text
    assert "better on" in text
    assert "failed within 30 d" in text
    assert f"reads {calibration.name}" in text
    assert "Brier" in text
    assert "ECE" in text

"""The outcome evaluation's baselines (outcome_arm.py's `replay`): the same faults, the same person."""

from __future__ import annotations

from evaluation.outcome_arm import _fleet, _Hand, _inject, replay
from evaluation.outcome_metrics import node_hours
from evaluation.outcome_world import monday_before, outcome_scenario


def test_a_baseline_is_the_same_whatever_ran_before_it_in_the_process() -> None:
    """The person's draws follow the faults, not the mock's fault ids, which count on across a process: a
    baseline run after the simulated arms (make evaluate) is the one run on its own."""
    oscen = outcome_scenario(301, days=2)
    start = monday_before(1_790_000_000.0)
    first = replay("no automation", oscen, 301, start)
    _inject(_fleet(oscen, 301, start, _Hand()), oscen)  # faults made in between: the ids move on
    again = replay("no automation", oscen, 301, start)
    assert first.visits
    assert again.visits == first.visits
    assert node_hours(again) == node_hours(first)

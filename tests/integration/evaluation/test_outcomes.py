"""Issue 40 on the real database: the live remediator on the simulation's clock, scored against what happened.

A small fleet's Monday: a reset-fixable XID, a failed row remap and a job's crash, through the real
collector parsing, sink writer, scorer and remediator (evaluation/outcomes.py), the mock's remedies
and a person within 4 working hours. The accounting must see what the ground truth says happened.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from evaluation.outcome_arm import Arm, replay
from evaluation.outcome_metrics import back_at, figures, node_hours
from evaluation.outcome_world import OutcomeScenario
from evaluation.scenario import Scenario
from services.scorer.rules_config import load_rules
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings

H = 3600.0
MONDAY = datetime(2026, 11, 2, tzinfo=UTC).timestamp() + 17.5
CLASSES = ("reset", "persistent", "job")


def monday(hours: float) -> OutcomeScenario:
    faults: list[dict[str, object]] = [
        {"kind": "xid", "node": 0, "gpu": 1, "after_s": 3600.0 + 7.3, "params": {"code": 119}},
        {"kind": "row_remap_failure", "node": 1, "gpu": 0, "after_s": 5400.0 + 11.9},
        {"kind": "job_crash", "node": 2, "gpu": 0, "after_s": 7200.0 + 3.1, "duration_s": 300.0,
         "params": {"gpus": 2, "code": 13, "spread_s": 2.0}},
    ]  # fmt: skip
    scenario = Scenario(name="monday", hours=hours, nodes=3, gpus_per_node=2, seeds=[11], faults=faults,
                        poll_s=60.0, score_every_s=60.0)  # fmt: skip
    return OutcomeScenario(scenario, ["reset", "persistent", "job"], [0, 1, 2])


@pytest.mark.parametrize("loop_closed", [True, False])
def test_the_live_remediator_is_scored_against_the_ground_truth(
    db_settings: DatabaseSettings, loop_closed: bool
) -> None:
    oscen = monday(hours=16)
    with migrated_schema(db_settings, "outcomes") as scoped:
        arm = Arm(scoped, oscen, 11, load_rules(), loop_closed=loop_closed, start_s=MONDAY)
        try:
            timeline = arm.run(oscen.scenario.hours)
        finally:
            arm.close()
    got = figures(timeline, CLASSES)
    reset, persistent, job = got["reset"], got["persistent"], got["job"]
    assert (reset.faults, persistent.faults, job.faults) == (1, 1, 1)
    # the remediator took the reset's and the remap's nodes out within minutes of each fault, and drained them
    for node, fault_s in (("gpu-node-00", MONDAY + 3600 + 7.3), ("gpu-node-01", MONDAY + 5400 + 11.9)):
        first = timeline.out[node][0][0]
        assert fault_s < first <= fault_s + 5 * 60, node
    # a job's crash is the job's: its node is never taken out, nothing of it is evicted
    assert "gpu-node-02" not in timeline.out
    assert (job.healthy_out, job.pods, job.people) == (0, 0, 0)
    # no node came back with its fault still there; nothing healthy was taken out
    assert sum(x.faulty_returns for x in got.values()) == 0
    assert sum(x.healthy_out for x in got.values()) == 0
    # the failed remap waits for a person: after their visit (Monday, working hours) and a 2 h repair,
    # the remediator validates it and it is back
    assert persistent.automatic == 0
    assert persistent.people >= 1
    (remap,) = [i for i in timeline.incidents if i.cls == "persistent"]
    back = back_at(timeline, remap)
    assert back is not None
    visits = [at for at, node, _ in timeline.visits if node == "gpu-node-01"]
    assert visits
    assert MONDAY + 9 * H - 17.5 <= visits[0] <= MONDAY + 13 * H
    assert back >= visits[0] + 7200
    # the mock says what each remedy did: the remediator's reset ended the XID
    resets = [r for r in timeline.remedies if r["remedy"] == "reset_gpu" and r["hostname"] == "gpu-node-00"]
    assert resets
    assert resets[0]["ok"]
    assert resets[0]["faults_ended"]
    if loop_closed:
        # the reset resolved its finding: validated and back with no one, within 15 simulated minutes
        assert (reset.automatic, reset.within_15min, reset.people) == (1, 1, 0)
    else:
        # the loop open: the reset fixed the GPU but its finding stayed, so the node waited for a person
        assert reset.automatic == 0
        assert reset.people >= 1
    # the same faults with no automation: a person for each, and more node-hours than the closed loop
    baseline = replay("no automation", oscen, 11, MONDAY)
    alone = figures(baseline, CLASSES)
    assert (alone["reset"].people, alone["persistent"].people, alone["job"].people) == (1, 1, 0)
    if loop_closed:
        assert node_hours(timeline) < node_hours(baseline)

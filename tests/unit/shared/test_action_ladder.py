"""The action ladder: one ordered table with a reason per rung; repeats climb it only up to inspect."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from services.scorer.escalation import escalate
from shared.contract.models_health import ACTION_REASONS, LADDER, REPEAT_CEILING, Action, HealthVerdict


def test_every_action_has_its_place_and_reason() -> None:
    assert get_args(Action) == LADDER
    assert set(ACTION_REASONS) == set(LADDER)
    assert all(len(why) > 20 for why in ACTION_REASONS.values())
    # what the catalogue and the operators' anchors need, above what needs no person on site
    cheapest_first = ("none", "restart_workload", "reset_gpu", "reboot_node", "inspect",
                      "run_diagnostics", "check_mechanicals", "send_for_repair")  # fmt: skip
    order = [LADDER.index(a) for a in cheapest_first]
    assert order == sorted(order)


def test_the_contract_speaks_the_ladder() -> None:
    assert HealthVerdict.model_json_schema()["properties"]["action"]["enum"] == list(LADDER)


@given(action=st.sampled_from(LADDER), repeats=st.integers(min_value=-5, max_value=50))
def test_repeats_climb_one_rung_each_up_to_inspect_and_never_down(action: Action, repeats: int) -> None:
    climbed = escalate(action, repeats)
    rank, ceiling = LADDER.index(action), LADDER.index(REPEAT_CEILING)
    if action == "none" or repeats <= 0 or rank >= ceiling:
        assert climbed == action
    else:
        assert LADDER.index(climbed) == min(rank + repeats, ceiling)

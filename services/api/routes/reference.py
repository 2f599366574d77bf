"""Reference data (no database): the recommended actions in the order they escalate."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shared.contract.models_health import ACTION_REASONS, LADDER

from ..answers.reference import ActionLadder, LadderRung
from ..parameters import NoQuery

router = APIRouter(tags=["reference"])

LADDER_ANSWER = ActionLadder(
    actions=[LadderRung(action=a, rank=i, why=ACTION_REASONS[a]) for i, a in enumerate(LADDER)]
)


@router.get("/reference/actions")
async def action_ladder(query: Annotated[NoQuery, Query()]) -> ActionLadder:
    """The recommended actions, cheapest first, each with why it sits where it does.

    The ladder is shared.contract.models_health's.
    """
    return LADDER_ANSWER

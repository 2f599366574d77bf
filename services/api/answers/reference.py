"""Reference data the answers speak of, served from the code that decides it: the action ladder."""

from __future__ import annotations

from shared.contract.models_health import Action

from . import Answer


class LadderRung(Answer):
    action: Action
    rank: int  # 0 for none; a higher rank costs the fleet more
    why: str


class ActionLadder(Answer):
    actions: list[LadderRung]

"""Recommended actions and how they escalate when the same fault repeats on the same GPU.

Kept apart from the verdicts (rules.py) so the action policy reads, and changes,
in one place:

- a fault that repeats moves one rung up the ladder (shared.contract.models_health.LADDER)
  per repeat within the escalation window, up to inspect (REPEAT_CEILING): the
  rungs above it (diagnostics, mechanicals, repair) are named by rules, never
  reached by counting;
- a fall off the bus is one episode however it was seen: an XID 79, a
  gpu_lost event, or both; the second episode after a reboot means inspect;
- application XIDs (NVIDIA: the workload's fault) are NVIDIA's workflows and
  judge their own repeats (workflows.py);
- the evidence names the occurrences that were counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.contract.models_health import LADDER, REPEAT_CEILING, Action

from .features import XidCounts, XidValue
from .rules_config import Rules

FELL_OFF_THE_BUS = 79


def escalate(action: Action, repeats: int) -> Action:
    """One rung up the ladder per repeat of the same fault (e.g. XID 79 after two reboots: inspect),
    up to REPEAT_CEILING; an action already above it stays where it is."""
    rank, ceiling = LADDER.index(action), LADDER.index(REPEAT_CEILING)
    if action == "none" or repeats <= 0 or rank >= ceiling:
        return action
    return LADDER[min(rank + repeats, ceiling)]


def xid_counts(value: XidValue) -> XidCounts:
    """Plain (recent, total) tuples are read as counts with no repeat window or times."""
    return value if isinstance(value, XidCounts) else XidCounts(int(value[0]), int(value[1]))


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    evidence: dict[str, Any]


def fall_off_episodes(xid79_total: int, lost_times: tuple[str, ...]) -> int:
    """Episodes of falling off the bus: each is seen as an XID 79, a gpu_lost event, or both."""
    return max(xid79_total, len(lost_times))


def fall_off_action(base: Action, xid79: XidValue | None, lost_times: tuple[str, ...]) -> Decision:
    counts = xid_counts(xid79) if xid79 is not None else XidCounts(0, 0)
    episodes = fall_off_episodes(counts.total, lost_times)
    return Decision(
        escalate(base, episodes - 1),
        {
            "fall_off_episodes": episodes,
            "repeats_counted": {"xid_79": list(counts.times), "gpu_lost": list(lost_times)},
        },
    )


def xid_action(
    code: int, value: XidValue, base: Action, rules: Rules, lost_times: tuple[str, ...]
) -> Decision:
    """The action for an XID seen within its time-to-clear, given its history on this GPU."""
    counts = xid_counts(value)
    if code == FELL_OFF_THE_BUS:
        return fall_off_action(base, value, lost_times)
    return Decision(escalate(base, counts.total - 1), {"repeats_counted": list(counts.times)})

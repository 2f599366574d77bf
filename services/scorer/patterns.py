"""Pattern rules (the rules file's [[patterns]]): counts of signals on one GPU within a window -> a finding.

A pattern counts signals (XIDs of a code or a catalogue class, events of a kind,
remediations that took, remedies carried out, and what a remedy resolved seen
again within the pattern's window after it) on one GPU. Signals each within `burst_s` of the one before
form a burst, which counts once per `burst_s` it spans (a flood of one XID is one
occurrence a burst window, not a hundred thousand). The pattern holds while at
least `at_least` occurrences fall within `window_s`, and for `sticky_s` more after
the occurrence that last reached the count. A cancelling signal closes it: nothing
before the newest one counts. The finding names the pattern and lists the
occurrences it counted.

The database folds signals into bursts (shared.store.verdict_inputs.pattern_signals);
this module decides from the bursts, so it is exact whatever the number of signals.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.gpu.xid_catalog import XidEntry

from .rules_config import Pattern, Rules

_SHOWN = 10  # occurrences listed in a finding's evidence


@dataclass(frozen=True, slots=True)
class Burst:
    first: datetime
    last: datetime
    lines: int  # the signals in it


@dataclass(frozen=True, slots=True)
class PatternFinding:
    pattern: Pattern
    evidence: dict[str, Any]


def occurrences(burst: Burst, burst_s: float) -> int:
    """A burst counts once per burst_s it spans (one, for a burst shorter than burst_s)."""
    if burst_s <= 0:
        return burst.lines
    return 1 + int((burst.last - burst.first).total_seconds() // burst_s)


def judge_pattern(
    pattern: Pattern, bursts: tuple[Burst, ...], cancelled_at: datetime | None, as_of: datetime
) -> PatternFinding | None:
    """The pattern's finding on one GPU as of `as_of`, or None where it does not hold."""
    live = sorted((b for b in bursts if cancelled_at is None or b.last > cancelled_at), key=lambda b: b.last)
    window = timedelta(seconds=pattern.window_s)

    def counted(at: datetime) -> list[Burst]:
        return [b for b in live if at - window < b.last <= at]

    def total(found: list[Burst]) -> int:
        return sum(occurrences(b, pattern.burst_s) for b in found)

    now = counted(as_of)
    reached = [b.last for b in live if b.last <= as_of and total(counted(b.last)) >= pattern.at_least]
    last_reached = max(reached, default=None)
    sticky = (
        pattern.sticky_s > 0
        and last_reached is not None
        and (as_of - last_reached).total_seconds() <= pattern.sticky_s
    )
    if total(now) < pattern.at_least and not sticky:
        return None
    shown = now if total(now) >= pattern.at_least or last_reached is None else counted(last_reached)
    evidence: dict[str, Any] = {
        "pattern": pattern.name,
        "why": pattern.why,
        "counts": list(pattern.counts),
        "counted": total(shown),
        "at_least": pattern.at_least,
        "window_s": pattern.window_s,
        "burst_s": pattern.burst_s,
        "occurrences": [
            {"first": _stamp(b.first), "last": _stamp(b.last), "lines": b.lines}
            for b in sorted(shown, key=lambda b: b.last, reverse=True)[:_SHOWN]
        ],
    }
    if pattern.sticky_s > 0 and last_reached is not None:
        evidence["sticky_until"] = _stamp(last_reached + timedelta(seconds=pattern.sticky_s))
    if cancelled_at is not None:
        evidence["counted_since"] = _stamp(cancelled_at)
    return PatternFinding(pattern, evidence)


def _stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _codes(signals: list[str], catalogue: dict[int, XidEntry]) -> list[int]:
    """The XID codes signals name: xid:<code>, and those of xid_class:<class> that are findings."""
    codes: set[int] = set()
    for signal in signals:
        kind, _, value = signal.partition(":")
        if kind == "xid":
            codes.add(int(value))
        elif kind == "xid_class":
            codes |= {c for c, e in catalogue.items() if e.xid_class == value and e.severity != "info"}
    return sorted(codes)


def _kinds(signals: list[str]) -> list[str]:
    """Event kinds (event:<kind>), the verdict signals by their names (changed, recovered, remediated), and
    the remedy signals as they are (remedy:<rung>, recurred:<rung>)."""
    return sorted(
        {
            s.partition(":")[2] if s.startswith("event:") else s
            for s in signals
            if ":" not in s or s.startswith(("event:", "remedy:", "recurred:"))
        }
    )


def pattern_queries(rules: Rules) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...], float]:
    """What the database reads for the pattern rules: a row per pattern, the event kinds, the reach."""
    rows: list[dict[str, Any]] = []
    kinds: set[str] = set()
    for idx, p in enumerate(rules.patterns):
        counted, cancels = _kinds(p.counts), _kinds(p.cancelled_by)
        codes, cancel_codes = _codes(p.counts, rules.xid), _codes(p.cancelled_by, rules.xid)
        rows.append(
            {
                "idx": idx,
                "kinds": counted,
                "codes": codes,
                "reach_s": p.window_s + p.sticky_s,
                "burst_s": p.burst_s,
                "cancel_kinds": cancels,
                "cancel_codes": cancel_codes,
                "within_s": p.window_s,
            }
        )
        kinds |= {*counted, *cancels, *(["xid"] if codes or cancel_codes else [])}
    reach = max((p.window_s + p.sticky_s for p in rules.patterns), default=0.0)
    return tuple(rows), tuple(sorted(kinds)), reach

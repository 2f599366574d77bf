"""The fleet page's usage view, drawn on the server: a week's GPU-hours by class and by namespace, per day.

Every figure is text beside its bar (GPU-hours, shares in per cent), and each bar
carries an `aria-label` saying what it shows, so the view reads without colour,
without JavaScript and in a screen reader. The numbers are the usage endpoints'
own answers (services.api.routes.usage), for the last 7 days.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

from .deps import State
from .parameters import UsageQuery, UsageTimelineQuery
from .routes.usage import usage_by, usage_timeline

CLASSES = ("training", "inference", "llm_serving", "gaming", "compute", "none", "unknown")
NAMESPACES_SHOWN = 10


def pct(share: float | None) -> str:
    return "–" if share is None else f"{share * 100:.1f} %"


def hours(value: float) -> str:
    return f"{value:,.1f}"


def bar(share: float, what: str, css: str = "") -> str:
    width = max(0.0, min(share, 1.0)) * 100
    label = escape(what)
    return f'<span class="ubar {css}" role="img" aria-label="{label}" style="width:{width:.1f}%"></span>'


def said(total: dict[str, Any]) -> str:
    if not total["gpu_hours"]:
        return "no GPU reported in the last 7 days"
    kwh = total["energy_kwh"]
    energy = "" if kwh is None else f"; {kwh:,.1f} kWh from the energy counters"
    return (
        f"{hours(total['gpu_hours'])} GPU-hours on {total['gpus']} GPUs; busy {pct(total['busy_share'])}; "
        f"idle while allocated {pct(total['idle_allocated_share'])} "
        f"({hours(total['idle_allocated_hours'])} GPU-hours){energy}"
    )


def colour(key: str) -> str:
    """A class's colour (the text says the class, the colour only repeats it); anything else one colour."""
    return f"c-{key}" if key in CLASSES else "c-other"


def group_rows(groups: list[dict[str, Any]], total_hours: float, none: str) -> str:
    rows = []
    for g in groups:
        name = g["key"] if g["key"] is not None else none
        share = g["gpu_hours"] / total_hours if total_hours else 0.0
        shown = bar(share, f"{name}: {pct(share)} of the GPU-hours", colour(name))
        rows.append(
            f'<tr data-key="{escape(name)}"><td>{escape(name)}</td><td>{hours(g["gpu_hours"])}</td>'
            f'<td class="share"><span class="utrack">{shown}</span> {pct(share)}</td>'
            f"<td>{pct(g['busy_share'])}</td><td>{pct(g['idle_allocated_share'])}</td></tr>"
        )
    return "".join(rows) or '<tr><td colspan="5">none</td></tr>'


def day_rows(periods: list[dict[str, Any]]) -> str:
    widest = max((p["total"]["gpu_hours"] for p in periods), default=0.0) or 1.0
    rows = []
    for p in periods:
        day, total = p["period"][:10], p["total"]
        parts = "".join(
            bar(g["gpu_hours"] / widest, f"{g['key']}: {hours(g['gpu_hours'])} GPU-hours", colour(g["key"]))
            for g in sorted(p["groups"], key=lambda g: CLASSES.index(g["key"]) if g["key"] in CLASSES else 99)
        )
        by_class = ", ".join(f"{g['key']} {hours(g['gpu_hours'])}" for g in p["groups"])
        rows.append(
            f'<tr data-day="{day}"><td>{day}</td><td class="stack">{parts}</td>'
            f"<td>{hours(total['gpu_hours'])}</td><td>{pct(total['idle_allocated_share'])}</td>"
            f"<td><small>{escape(by_class)}</small></td></tr>"
        )
    return "".join(rows) or '<tr><td colspan="5">no usage in the last 7 days</td></tr>'


async def usage_view(state: State) -> dict[str, str]:
    """The page's usage placeholders and what replaces them."""
    by_namespace = (await usage_by(state.db, state, UsageQuery())).model_dump(mode="json", by_alias=True)
    days = await usage_timeline(state.db, state, UsageTimelineQuery(by="class", step="1d"))
    timeline = days.model_dump(mode="json", by_alias=True)
    by_class: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"gpu_hours": 0.0, "busy_hours": 0.0, "idle_allocated_hours": 0.0}
    )
    for period in timeline["periods"]:  # the week by class: the days' sums (hours add up; GPUs would not)
        for g in period["groups"]:
            for figure in ("gpu_hours", "busy_hours", "idle_allocated_hours"):
                by_class[g["key"]][figure] += g[figure]
    total = by_namespace["total"]
    classes = [
        {
            "key": key,
            **f,
            "busy_share": f["busy_hours"] / f["gpu_hours"] if f["gpu_hours"] else None,
            "idle_allocated_share": f["idle_allocated_hours"] / f["gpu_hours"] if f["gpu_hours"] else None,
        }
        for key, f in sorted(by_class.items(), key=lambda kv: -kv[1]["gpu_hours"])
    ]
    start, end = (by_namespace[k][:16].replace("T", " ") for k in ("from", "to"))
    window = f"{start} – {end} UTC"
    return {
        "<!--USAGE-WINDOW-->": escape(window),
        "<!--USAGE-SAID-->": escape(said(total)),
        "<!--USAGE-CLASSES-->": group_rows(classes, total["gpu_hours"], "(no class)"),
        "<!--USAGE-NAMESPACES-->": group_rows(
            by_namespace["groups"][:NAMESPACES_SHOWN], total["gpu_hours"], "(no namespace)"
        ),
        "<!--USAGE-DAYS-->": day_rows(timeline["periods"]),
    }

"""`python -m services.api.cli fleet`: the fleet summary and the worst GPUs, in a terminal.

A thin client of the REST API (--url, default http://127.0.0.1:8000): the same
numbers as the web page, with sparklines of each listed GPU's last hour of
temperature and utilisation.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from typing import Any

import httpx

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return ""
    lo, hi = min(present), max(present)
    span = (hi - lo) or 1.0
    top = len(BARS) - 1
    return "".join(" " if v is None else BARS[min(int((v - lo) / span * top + 0.5), top)] for v in values)


def render(
    summary: dict[str, Any], worst: list[dict[str, Any]], series: dict[str, list[dict[str, Any]]]
) -> str:
    s = summary
    lines = [
        f"GPUs {s['gpus']}  healthy {s['healthy']}  degraded {s['degraded']}  "
        f"unhealthy {s['unhealthy']}  missing {s['missing']}  not scored {s['not_scored']}",
        f"avg temp {s['avg_temp_c']} °C  power {s['power_w']} W  avg util {s['avg_util_pct']} %  "
        f"open alerts {s['open_alerts'] or 'none'}",
        "",
        f"{'host':<16}{'gpu':>4}  {'state':<10}{'score':>6}  {'action':<17}"
        f"{'temp (1 h)':<32}{'util (1 h)':<32}",
    ]
    for g in worst:
        points = series.get(g["gpu_uuid"], [])
        temp = sparkline([p["temp_c"] for p in points][-30:])
        util = sparkline([p["util_pct"] for p in points][-30:])
        score = "-" if g["score"] is None else g["score"]
        lines.append(
            f"{g['hostname']:<16}{g['gpu_index']:>4}  {g['state'] or '-':<10}{score:>6}  "
            f"{g['action'] or '-':<17}{temp:<32}{util:<32}"
        )
    return "\n".join(lines)


def fleet(client: httpx.Client, top: int) -> str:
    summary = client.get("/api/v1/fleet/summary").raise_for_status().json()
    worst = (
        client.get("/api/v1/gpus", params={"sort": "score", "limit": top}).raise_for_status().json()["gpus"]
    )
    series: dict[str, list[dict[str, Any]]] = {}
    for g in worst:
        if not g["last_seen"]:
            continue
        end = datetime.fromisoformat(g["last_seen"]) + timedelta(minutes=1)
        params = {"from": (end - timedelta(hours=1)).isoformat(), "to": end.isoformat(), "bucket": "1m"}
        series[g["gpu_uuid"]] = (
            client.get(f"/api/v1/gpus/{g['gpu_uuid']}/series", params=params).json().get("points", [])
        )
    return render(summary, worst, series)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api.cli", description=__doc__)
    parser.add_argument("command", choices=["fleet"])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gpu-health API")
    parser.add_argument("--top", type=int, default=10, help="how many of the worst GPUs to list")
    args = parser.parse_args(argv)
    try:
        with httpx.Client(base_url=args.url, timeout=10) as client:
            print(fleet(client, args.top))
    except httpx.HTTPError as e:
        print(f"cannot reach the gpu-health API at {args.url}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

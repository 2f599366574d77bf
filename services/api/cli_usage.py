"""`gpuhealth usage`: GPU-hours by a dimension, busy and idle shares, energy; LLM serving; as text or a file.

    gpuhealth usage                                   # by namespace, the last 7 days
    gpuhealth usage --by user --where class=training --days 30
    gpuhealth usage --by class --step 1d              # per day
    gpuhealth usage --export week.parquet             # the same rows as a file (.csv, .parquet; - : CSV out)
    gpuhealth usage --llm --step 1h --days 1          # LLM serving per model and server

The numbers are the API's (/api/v1/usage, /usage/timeline, /usage/export, /llm/timeline).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from .cli_args import arg

Fetch = Callable[..., Any]
DIMENSIONS = ("namespace", "job", "pod", "user", "class", "hostname", "cluster", "gpu")


def where_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or name not in DIMENSIONS or not value:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give DIMENSION=VALUE, DIMENSION one of {', '.join(DIMENSIONS)}"
        )
    return name, value


def iso_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (2026-11-20T00:00:00Z)") from None


USAGE_HELP = "GPU-hours by namespace, job, user, class...: busy, idle while allocated, energy"
USAGE_ARGUMENTS = (
    arg("--by", default="namespace", choices=DIMENSIONS, help="what to group by (default: namespace)"),
    arg("--days", type=float, default=7.0, help="the window: this many days up to --to (default 7)"),
    arg("--from", dest="start", type=iso_time, help="the window's start (ISO 8601, UTC); overrides --days"),
    arg("--to", dest="end", type=iso_time, help="the window's end (ISO 8601, UTC; default: now)"),
    arg(
        "--where",
        type=where_pair,
        action="append",
        default=[],
        metavar="DIMENSION=VALUE",
        help="count only this (repeatable): namespace=ml, class=training...",
    ),
    arg("--step", choices=("1h", "6h", "1d"), help="per period instead of the whole window"),
    arg("--llm", action="store_true", help="LLM serving per model and server instead (step 1h or 1d)"),
    arg("--model", help="with --llm: only this model"),
    arg("--server", help="with --llm: only this server"),
    arg("--export", metavar="FILE", help="write the rows to FILE: .csv or .parquet (- : CSV to stdout)"),
)


def window(args: argparse.Namespace) -> dict[str, str]:
    end = args.end or datetime.now(UTC)
    start = args.start or end - timedelta(days=args.days)
    return {"from": start.isoformat(), "to": end.isoformat()}


def num(value: float | None, spec: str = ",.1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def pct(share: float | None) -> str:
    return num(None if share is None else share * 100, ".1f", " %")


def figures_line(label: str, f: dict[str, Any]) -> str:
    return (
        f"{label[:26]:<27}{f['gpus']:>5}{num(f['gpu_hours']):>12}{pct(f['busy_share']):>10}"
        f"{pct(f['idle_allocated_share']):>13}{num(f['avg_util_pct'], '.1f', ' %'):>9}"
        f"{num(f['energy_kwh'], ',.2f'):>13}"
    )


def render_usage(body: dict[str, Any], by: str) -> str:
    period = f", per {body['step']}" if "step" in body else ""
    start, end = (body[k][:16].replace("T", " ") for k in ("from", "to"))
    head = [
        f"GPU usage by {by}{period}, {start} – {end} UTC",
        f"{by:<27}{'GPUs':>5}{'GPU-hours':>12}{'busy':>10}{'idle alloc':>13}{'util':>9}{'energy kWh':>13}",
    ]
    periods = body["periods"] if "step" in body else [{"period": None, **body}]
    lines = []
    for p in periods:
        if p["period"]:
            lines.append(p["period"][:16].replace("T", " "))
        lines += [figures_line(g["key"] if g["key"] is not None else f"(no {by})", g) for g in p["groups"]]
        lines.append(figures_line("total", p["total"]))
    if not body.get("periods", True):
        lines.append("no usage in the window")
    return "\n".join(head + lines)


def render_llm(body: dict[str, Any]) -> str:
    lines = [
        f"LLM serving per {body['step']}, {body['from'][:16].replace('T', ' ')} – "
        f"{body['to'][:16].replace('T', ' ')} UTC",
        f"{'period':<17}{'model':<22}{'server':<18}{'requests':>9}{'errors':>7}{'tokens in':>11}{'out':>11}"
        f"{'TTFT p50/p95 ms':>18}{'TPOT p50 ms':>12}{'tok/s p50':>10}",
    ]
    for p in body["periods"]:
        ttft = f"{num(p['ttft_p50_ms'], '.0f')}/{num(p['ttft_p95_ms'], '.0f')}"
        lines.append(
            f"{p['period'][:16].replace('T', ' '):<17}{p['model'][:21]:<22}{p['server'][:17]:<18}"
            f"{p['requests']:>9}{p['errors']:>7}{p['prompt_tokens']:>11,}{p['completion_tokens']:>11,}"
            f"{ttft:>18}{num(p['tpot_p50_ms'], '.1f'):>12}{num(p['tps_p50'], '.1f'):>10}"
        )
    return "\n".join(lines if body["periods"] else [*lines, "no LLM requests in the window"])


def usage_command(client: httpx.Client, args: argparse.Namespace, get: Fetch, download: Fetch) -> str | bytes:
    """What `gpuhealth usage` prints (text) or writes (bytes, for --export); `get` and `download` are the
    CLI's (JSON, and a file's bytes), which raise its refusal on a 4xx/5xx."""
    params: dict[str, Any] = {**window(args), **dict(args.where)}
    if args.llm:
        llm = {k: v for k, v in {"model": args.model, "server": args.server}.items() if v}
        return render_llm(get(client, "/api/v1/llm/timeline", step=args.step or "1d", **window(args), **llm))
    params["by"] = args.by
    if args.step:
        params["step"] = args.step
    if args.export:
        fmt = "parquet" if Path(args.export).suffix == ".parquet" else "csv"
        exported: bytes = download(client, "/api/v1/usage/export", **params, format=fmt)
        return exported
    path = "/api/v1/usage/timeline" if args.step else "/api/v1/usage"
    return render_usage(get(client, path, **params), args.by)

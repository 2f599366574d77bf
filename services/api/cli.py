"""`gpuhealth`: the fleet, one GPU, the alerts, the action ladder, the remediator and lifecycle decisions.

A thin client of the REST API (--url or GPUHEALTH_URL, default
http://127.0.0.1:8000): the same numbers as the web page, as plain text, with
sparklines of the worst GPUs' last hour. Every call carries the caller's bearer
token, read from --token-file or $GPUHEALTH_TOKEN_FILE (`make up` writes one per
role under $GPUHEALTH_RUN/auth/), else asked for on the terminal; never taken on
the command line. Reading needs a viewer's token; acknowledging and marking
repaired, an operator's; pausing, resuming, resetting the breaker of and approving
the remediator, an admin's. The API records the token's subject as who did it.
The venv installs it as `gpuhealth` (scripts/pyenv.sh); `python -m
services.api.cli` is the same program.

Exit status: 0 done, 1 the API could not be reached, 2 the API refused the
request (the status and the API's own message are printed).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from shared.plumbing.errors import GpuHealthError

from .cli_args import Command, Export, arg, parser
from .cli_token import TokenError, read_token
from .cli_usage import USAGE_ARGUMENTS, USAGE_HELP, usage_command

BARS = "▁▂▃▄▅▆▇█"
STATE_MARK = {"healthy": "OK ", "degraded": "DEG", "unhealthy": "BAD", None: "-- "}


class RefusedError(GpuHealthError):
    """The API answered, with a 4xx/5xx."""

    def __init__(self, response: httpx.Response) -> None:
        try:
            detail = response.json().get("detail", "")
        except ValueError:
            detail = response.text[:200]
        request = response.request
        super().__init__(
            f"the gpu-health API refused {request.method} {request.url.path}: "
            f"{response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else "")
        )


def sparkline(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return ""
    lo, hi = min(present), max(present)
    span = (hi - lo) or 1.0
    top = len(BARS) - 1
    return "".join(" " if v is None else BARS[min(int((v - lo) / span * top + 0.5), top)] for v in values)


def counts(by_severity: dict[str, int]) -> str:
    shown = [f"{n} {sev}" for sev in ("critical", "warning", "info") if (n := by_severity.get(sev, 0))]
    return ", ".join(shown) or "none"


def fmt(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def render(
    summary: dict[str, Any], worst: list[dict[str, Any]], series: dict[str, list[dict[str, Any]]]
) -> str:
    s = summary
    lines = [
        f"GPUs {s['gpus']}  healthy {s['healthy']}  degraded {s['degraded']}  "
        f"unhealthy {s['unhealthy']}  missing {s['missing']}  not scored {s['not_scored']}",
        f"avg temp {fmt(s['avg_temp_c'], ' °C')}  power {fmt(s['power_w'], ' W')}  "
        f"avg util {fmt(s['avg_util_pct'], ' %')}  open alerts: {counts(s['open_alerts'])}",
        "",
        f"{'host':<16}{'gpu':>4}  {'state':<14}{'score':>6}  {'action':<17}"
        f"{'temp (1 h)':<32}{'util (1 h)':<32}",
    ]
    for g in worst:
        points = series.get(g["gpu_uuid"], [])
        temp = sparkline([p["temp_c"] for p in points][-30:])
        util = sparkline([p["util_pct"] for p in points][-30:])
        state = f"{STATE_MARK.get(g['state'], '?  ')} {g['state'] or 'not scored'}"
        lines.append(
            f"{g['hostname']:<16}{g['gpu_index']:>4}  {state:<14}{fmt(g['score']):>6}  "
            f"{g['action'] or '-':<17}{temp:<32}{util:<32}"
        )
    return "\n".join(lines)


def get(client: httpx.Client, path: str, **params: Any) -> Any:
    response = client.get(path, params=params)
    if response.is_error:
        raise RefusedError(response)
    return response.json()


def download(client: httpx.Client, path: str, **params: Any) -> bytes:
    response = client.get(path, params=params)
    if response.is_error:
        raise RefusedError(response)
    return response.content


def fleet(client: httpx.Client, top: int) -> str:
    summary = get(client, "/api/v1/fleet/summary")
    worst = get(client, "/api/v1/gpus", sort="score", limit=top)["gpus"]
    series: dict[str, list[dict[str, Any]]] = {}
    for g in worst:
        if not g["last_seen"]:
            continue
        end = datetime.fromisoformat(g["last_seen"]) + timedelta(minutes=1)
        window = {"from": (end - timedelta(hours=1)).isoformat(), "to": end.isoformat(), "bucket": "1m"}
        series[g["gpu_uuid"]] = get(client, f"/api/v1/gpus/{g['gpu_uuid']}/series", **window)["points"]
    return render(summary, worst, series)


def ladder(client: httpx.Client) -> list[dict[str, Any]]:
    rungs: list[dict[str, Any]] = get(client, "/api/v1/reference/actions")["actions"]
    return rungs


def actions(client: httpx.Client) -> str:
    rungs = ladder(client)
    return "\n".join(
        ["recommended actions, cheapest first:"]
        + [f"{r['rank']:>2}  {r['action']:<18}{r['why']}" for r in rungs]
    )


def gpu(client: httpx.Client, uuid: str) -> str:
    d = get(client, f"/api/v1/gpus/{uuid}")
    a, status = d["asset"], d["status"] or {}
    action = status.get("action")
    why = {r["action"]: r for r in ladder(client)}.get(action) if action else None
    lines = [
        f"{uuid}  {a['model']}  host {a['hostname']} gpu {a['gpu_index']}  rack {a.get('rack') or '-'}",
        f"state {status.get('state') or 'not scored'}  score {fmt(status.get('score'))}  "
        f"action {action or '-'}" + (f" (rung {why['rank']}: {why['why']})" if why else ""),
        "",
        f"{'subsystem':<14}{'state':<11}{'rule':<28}evidence",
    ]
    for v in d["verdicts"]:
        evidence = ", ".join(f"{k}={val}" for k, val in sorted(v["evidence"].items())) or "-"
        lines.append(f"{v['subsystem']:<14}{v['state']:<11}{v['rule'] or '-':<28}{evidence}")
    lines += ["", "open alerts:" if d["open_alerts"] else "open alerts: none"]
    for al in d["open_alerts"]:
        lines.append(f"  #{al['id']} {al['severity']} {al['state']}: {al['summary']}")
        if al.get("shared"):
            lines.append(shared_line(al["shared"]))
    return "\n".join(lines)


def alerts(client: httpx.Client, limit: int) -> str:
    body = get(client, "/api/v1/alerts", limit=limit)
    lines = [
        f"{body['total']} unresolved alert(s)" + (f", newest {limit} shown" if body["next_cursor"] else "")
    ]
    for al in body["alerts"]:
        lines.append(
            f"#{al['id']:<6} {al['severity']:<9}{al['state']:<13}{al['hostname']:<16}"
            f"gpu {fmt(al['gpu_index']):<3} {al['kind']}: {al['summary']}"
        )
        if al.get("shared"):
            lines.append(shared_line(al["shared"]))
    return "\n".join(lines)


def shared_line(f: dict[str, Any]) -> str:
    """A job's crash or a fault of a place: whom it names, its GPUs and hosts (the alert's GPU holds it)."""
    more = f" (+{f['gpu_count'] - len(f['gpus'])} more)" if f["gpu_count"] > len(f["gpus"]) else ""
    return (
        f"        {f['scope']} {f['key']}: {f['gpu_count']} GPUs on {', '.join(f['hosts'])}: "
        f"{' '.join(f['gpus'])}{more}"
    )


def _mark(client: httpx.Client, path: str, body: dict[str, str]) -> Any:
    """POST a mark (an operator's); the row it made, RefusedError when the API refused it."""
    response = client.post(path, json=body)
    if response.is_error:
        raise RefusedError(response)
    return response.json()


def mark_repaired(client: httpx.Client, uuid: str, *, returned: bool, note: str) -> str:
    body = {"kind": "returned" if returned else "repaired", "note": note}
    done = _mark(client, f"/api/v1/gpus/{uuid}/repairs", body)
    return (
        f"{uuid} marked {done['kind']} by {done['marked_by']} at {done['time']}: its findings resolve "
        "and its counts start again from the next scoring cycle"
    )


def mark_remedied(client: httpx.Client, uuid: str, *, reboot: bool, note: str) -> str:
    body = {"remedy": "reboot_node" if reboot else "reset_gpu", "note": note}
    done = _mark(client, f"/api/v1/gpus/{uuid}/remedies", body)
    return (
        f"{uuid}: {done['remedy']} by {done['actor']} at {done['at']} recorded: from the next scoring "
        "cycle the XIDs it resolves count only after it"
    )


def remedies(client: httpx.Client, uuid: str) -> str:
    found = get(client, f"/api/v1/gpus/{uuid}/remedies")["remedies"]
    if not found:
        return f"{uuid}: no remedy recorded"
    lines = []
    for r in found:
        by = f"plan {r['plan_id']}" if r["plan_id"] is not None else f"{r['source']} {r['actor']}"
        lines.append(f"{r['at']}  {r['remedy']:<12} by {by}" + (f": {r['note']}" if r["note"] else ""))
    return "\n".join(lines)


def repairs(client: httpx.Client, uuid: str) -> str:
    marks = get(client, f"/api/v1/gpus/{uuid}/repairs")["repairs"]
    if not marks:
        return f"{uuid}: never marked repaired"
    lines = [f"{m['time']}  {m['kind']:<9} by {m['marked_by']}" for m in marks]
    return "\n".join(
        line + (f": {m['note']}" if m["note"] else "") for line, m in zip(lines, marks, strict=True)
    )


def acknowledge(client: httpx.Client, alert_id: int) -> str:
    done = post(client, f"/api/v1/alerts/{alert_id}/acknowledge")
    return f"alert #{done['id']} on {done['hostname']} acknowledged by {done['acknowledged_by']}"


def post(client: httpx.Client, path: str) -> Any:
    """A write: the token's subject is who did it, its role whether it may."""
    response = client.post(path)
    if response.is_error:
        raise RefusedError(response)
    return response.json()


def remediations(client: httpx.Client, state: str, limit: int, mode: str = "both") -> str:
    body = get(client, "/api/v1/remediations", state=state, limit=limit, mode=mode)
    shown = "" if mode == "both" else f" {mode.replace('_', ' ')}"
    lines = [
        f"{body['total']} {state}{shown} remediation(s)"
        + (f", newest {limit} shown" if body["next_cursor"] else "")
    ]
    for p in body["remediations"]:
        step = p["steps"][p["step"]] if p["step"] < len(p["steps"]) else "end"
        why = f" ({p['held_for']})" if p["held_for"] else ""
        mode = " [dry run]" if p["dry_run"] else ""
        lines.append(
            f"#{p['id']:<6} {p['state'] + why:<22}{p['node']:<18}{p['action']:<18}at {step:<10}"
            f"{p['finding']}{mode}"
        )
    return "\n".join(lines)


def remediator(client: httpx.Client) -> str:
    modes = get(client, "/api/v1/remediator")["modes"]
    lines = []
    for m in modes:
        breaker = f"OPEN since {m['tripped_at']}: {m['trip_reason']}" if m["breaker"] == "open" else "closed"
        paused = f"paused by {m['paused_by']}" if m["paused"] else "running"
        lines.append(f"{'dry run' if m['dry_run'] else 'live':<8} {paused:<24} breaker {breaker}")
    return "\n".join(lines)


def operate(client: httpx.Client, what: str) -> str:
    post(client, f"/api/v1/remediator/{what}")
    return remediator(client)


def approve(client: httpx.Client, plan_id: int) -> str:
    done = post(client, f"/api/v1/remediations/{plan_id}/approve")
    return f"remediation #{done['id']} ({done['action']} on {done['node']}) approved by {done['approved_by']}"


def lifecycle(client: httpx.Client, decision: str | None, host: str | None, limit: int) -> str:
    filters = {k: v for k, v in {"decision": decision, "host": host}.items() if v}
    body = get(client, "/api/v1/lifecycle", limit=limit, **filters)
    run = body["run"]
    if run is None:
        return "no lifecycle decisions yet (is `python -m services.lifecycle` running?)"
    money = run["currency"]
    lines = [
        f"decided {run['time'][:16].replace('T', ' ')} UTC over {run['horizon_days']:g} days, "
        f"{run['gpus']} GPUs, inventory {run['inventory_rows']} rows ({run['inventory_problems']} refused)"
    ]
    lines += [f"  missing for the whole fleet: {m['input']}: {m['why']}" for m in run["missing_inputs"]]
    lines += [f"  {line}" for line in body["totals"]["said"]] or ["  every GPU: keep"]
    lines += [
        "",
        f"{'host':<16}{'gpu_uuid':<16}{'decision':<11}{'waiting/day':>12}{'cost':>10}{'p30':>6}"
        f"  {'warranty':<11}why",
    ]
    for d in body["decisions"]:
        p30 = "-" if d["p_fail_30d"] is None else f"{d['p_fail_30d']:.3f}"
        cost = "-" if d["expected_cost"] is None else f"{d['expected_cost']:,.0f}"
        lines.append(
            f"{(d['hostname'] or '-')[:15]:<16}{d['gpu_uuid'][:15]:<16}{d['decision']:<11}"
            f"{d['cost_of_waiting_per_day']:>12,.2f}{cost:>10}{p30:>6}  {d['warranty_end'] or '-':<11}"
            f"{d['why']}"
        )
    more = f" ({body['total'] - len(body['decisions'])} more: --limit)" if body["next_cursor"] else ""
    return "\n".join([*lines, f"amounts in {money}{more}"])


def lifecycle_csv(client: httpx.Client, decision: str | None, host: str | None) -> bytes:
    filters = {k: v for k, v in {"decision": decision, "host": host}.items() if v}
    response = client.get("/api/v1/lifecycle/export.csv", params=filters)
    if response.is_error:
        raise RefusedError(response)
    return response.content


def lifecycle_command(client: httpx.Client, args: argparse.Namespace) -> str | Export:
    if args.csv:
        return Export(lifecycle_csv(client, args.decision, args.host), args.csv)
    return lifecycle(client, args.decision, args.host, args.limit)


def usage(client: httpx.Client, args: argparse.Namespace) -> str | Export:
    said = usage_command(client, args, get, download)
    return said if isinstance(said, str) else Export(said, args.export)


UUID, NOTE, LIMIT = (
    arg("uuid"),
    arg("--note", default="", help="what was done"),
    arg("--limit", type=int, default=50),
)
STATES = (
    "all (default: the newest, whatever became of them), open, pending, running, failed, escalated,"
    " done, withdrawn"
)
# Every command, in the order `gpuhealth --help` lists them: adding one is adding its entry.
COMMANDS = {
    "fleet": Command(
        "fleet summary and the worst GPUs",
        lambda c, a: fleet(c, a.top),
        (arg("--top", type=int, default=10, help="how many of the worst GPUs to list"),),
    ),
    "gpu": Command(
        "one GPU: verdicts with evidence, action, open alerts", lambda c, a: gpu(c, a.uuid), (UUID,)
    ),
    "alerts": Command("unresolved alerts, most severe first", lambda c, a: alerts(c, a.limit), (LIMIT,)),
    "ack": Command(
        "acknowledge an alert (an operator's)",
        lambda c, a: acknowledge(c, a.alert_id),
        (arg("alert_id", type=int),),
    ),
    "actions": Command("the recommended actions in order, with why", lambda c, a: actions(c)),
    "remediations": Command(
        "the remediator's plans: pending, running, failed...",
        lambda c, a: remediations(c, a.state, a.limit, a.mode),
        (
            arg("--state", default="all", help=STATES),
            arg(
                "--mode",
                default="both",
                choices=("both", "live", "dry_run"),
                help="what the live run or the dry run did",
            ),
            LIMIT,
        ),
    ),
    "remediator": Command("whether the remediator is paused, its breaker open", lambda c, a: remediator(c)),
    "pause": Command("pause the remediator (an admin's)", lambda c, a: operate(c, a.command)),
    "resume": Command("resume it (an admin's)", lambda c, a: operate(c, a.command)),
    "reset-breaker": Command("close its circuit breaker (an admin's)", lambda c, a: operate(c, a.command)),
    "approve": Command(
        "approve a pending remediation (an admin's)",
        lambda c, a: approve(c, a.plan_id),
        (arg("plan_id", type=int),),
    ),
    "repaired": Command(
        "mark a GPU repaired (an operator's): its counts restart",
        lambda c, a: mark_repaired(c, a.uuid, returned=a.returned, note=a.note),
        (
            UUID,
            arg("--returned", action="store_true", help="back from repair (default: repaired in place)"),
            NOTE,
        ),
    ),
    "repairs": Command(
        "a GPU's repair marks, newest first (the audit trail)", lambda c, a: repairs(c, a.uuid), (UUID,)
    ),
    "remedied": Command(
        "record a GPU reset (or --reboot) done by hand (an operator's)",
        lambda c, a: mark_remedied(c, a.uuid, reboot=a.reboot, note=a.note),
        (UUID, arg("--reboot", action="store_true", help="the node was rebooted (default: GPU reset)"), NOTE),
    ),
    "remedies": Command(
        "a GPU's resets and reboots, newest first", lambda c, a: remedies(c, a.uuid), (UUID,)
    ),
    "lifecycle": Command(
        "keep, reset, RMA or repair, repurpose, retire: priced",
        lifecycle_command,
        (
            arg("--decision", help="only this decision (keep, reset, rma, repair, repurpose, ...)"),
            arg("--host", help="only this host"),
            arg("--limit", type=int, default=50, help="how many GPUs, the dearest wait first"),
            arg("--csv", metavar="FILE", help="write the whole list as CSV to FILE (- for stdout)"),
        ),
    ),
    "usage": Command(USAGE_HELP, usage, USAGE_ARGUMENTS),
}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, COMMANDS).parse_args(argv)
    try:
        token = read_token(args.token_file)
    except TokenError as e:
        print(f"gpuhealth: {e}", file=sys.stderr)
        return 2
    try:
        with httpx.Client(
            base_url=args.url, timeout=10, headers={"Authorization": f"Bearer {token}"}
        ) as client:
            said = COMMANDS[args.command].run(client, args)
            if isinstance(said, str):
                print(said)
            elif said.to == "-":
                sys.stdout.buffer.write(said.data)
            else:
                Path(said.to).write_bytes(said.data)
    except RefusedError as e:
        print(f"gpuhealth: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"gpuhealth: cannot reach the gpu-health API at {args.url}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

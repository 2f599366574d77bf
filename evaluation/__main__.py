"""`python -m evaluation` (`make evaluate [SCENARIO=file.json]`): does the scorer tell the truth?

Without a scenario file it runs the default suite: the generated scenario of
each evaluation seed (evaluation/scenario.py: 72 simulated hours of a 32-GPU
fleet of every model, precursors then failures, sudden failures, repeats,
transients, hot-but-healthy GPUs), none of whose seeds the predictor was fitted
on, and each seed's job scenario (24 h of job crashes across GPUs and hosts, a
node fault and a rack fault: evaluation/shared_faults.py says what is
scored). Each run feeds the simulated fleet through the collector's parser and
event detector and the sink's writer into a throwaway schema, scores it every
few simulated minutes with the real scorer, and compares with the mock's
ground truth (evaluation/metrics.py says what is measured and how).

Then a flood (evaluation/flood.py) runs through the real broker and database:
its lines counted in its rows, and the other GPUs' XIDs stored meanwhile.
Needs the database and broker of `make services`; the rest of the Kafka path is
exercised by the integration tests (evaluation/pipeline.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, get_args

from services.scorer.rules_config import DEFAULT_RULES, Rules, load_rules
from shared.gpu.xid_catalog import AgreementKind, agreement_table
from shared.settings.common import Settings

from .flood import evaluate_floods
from .metrics import Summary, summarise, totals
from .run import run_scenario
from .scenario import Scenario, generated_scenario, job_scenario, load_scenario
from .shared_faults import SHARED_CLASSES

EVAL_SEEDS = (101, 102, 103)


def suite(
    seeds: tuple[int, ...] = EVAL_SEEDS, hours: float = 72.0, **shape: Any
) -> list[tuple[Scenario, int]]:
    """Each seed's generated scenario, then each seed's job scenario (24 h of shared faults)."""
    generated = [(generated_scenario(seed, hours=hours, **shape), seed) for seed in seeds]
    return generated + [(job_scenario(seed), seed) for seed in seeds]


def evaluate(
    settings: Settings, runs: list[tuple[Scenario, int]], rules: Rules
) -> tuple[list[Summary], dict[str, Any]]:
    summaries = [summarise(run_scenario(settings.db, sc, seed, rules), rules) for sc, seed in runs]
    return summaries, totals(summaries)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _med(xs: list[float], scale: float = 1.0, unit: str = "") -> str:
    return f"{statistics.median(xs) / scale:.1f}{unit}" if xs else "-"


def agreement_lines(rules: Rules) -> list[str]:
    """The XID catalogue's actions against NVIDIA's immediate actions (mapped onto ours), per class."""
    table = agreement_table(rules.xid.values(), rules.xid_catalog.mapping())
    kinds: tuple[AgreementKind, ...] = get_args(AgreementKind)
    lines = ["XID catalogue against NVIDIA's immediate actions, per class (codes):",
             f"  {'class':<13}" + "".join(f"{k:>18}" for k in kinds) + f"{'total':>8}"]  # fmt: skip
    for cls, row in table.items():
        lines.append(f"  {cls:<13}" + "".join(f"{row[k]:>18}" for k in kinds) + f"{sum(row.values()):>8}")
    return lines


def shared_lines(total: dict[str, Any]) -> list[str]:
    """Job-level attribution and false escalations per class of what several GPUs show together."""
    lines = [
        "what several GPUs show together, per class: faults, seen as one finding, GPUs, GPUs judged",
        "(no fault of their own meanwhile), blamed (degraded or worse on xid for a job's crash), escalated",
        "(job: past restart_workload; node, rack: past what the signal gets on one GPU alone)",
        f"  {'class':<7}{'faults':>8}{'one finding':>13}{'GPUs':>7}{'judged':>8}{'blamed':>8}"
        f"{'escalated':>11}",
    ]
    for cls in SHARED_CLASSES:
        x = total["shared"][cls]
        blamed = str(x.blamed) if cls == "job" else "-"
        lines.append(
            f"  {cls:<7}{x.faults:>8}{f'{x.one_finding}/{x.faults}':>13}{x.gpus:>7}{x.judged:>8}"
            f"{blamed:>8}{x.escalated:>11}"
        )
    return lines  # fmt: skip


def render(summaries: list[Summary], total: dict[str, Any], rules: Rules) -> str:
    lines = [
        f"{'scenario':<18}{'seed':>5}{'hard det.':>11}{'median':>8}{'healthy':>8}{'hot':>4}{'false U':>8}"
        f"{'false D':>8}{'cleared':>9}{'off-bus->insp':>14}{'1 app XID>rw':>13}{'prec':>6}{'recall':>7}"
        f"{'rec48':>7}{'lead48 h':>9}{'max p30 ok':>11}",
    ]
    for x in summaries:
        lines.append(
            f"{x.scenario:<18}{x.seed:>5}{f'{x.hard_within_cycle}/{x.hard_faults}':>11}"
            f"{_med(x.hard_delays_s, 60, 'm'):>8}{x.healthy_gpus:>8}{x.hot_gpus:>4}{x.false_unhealthy:>8}"
            f"{x.false_degraded:>8}{f'{x.cleared}/{x.ended_faults}':>9}"
            f"{f'{x.fall_off_repeats_inspect}/{x.fall_off_repeats}':>14}"
            f"{f'{x.single_app_xid_past_restart}/{x.single_app_xids}':>13}"
            f"{_pct(x.true_predicted / x.predicted if x.predicted else None):>6}"
            f"{f'{x.with_precursor_predicted}/{x.with_precursor}':>7}"
            f"{f'{x.long_lead_predicted}/{x.long_lead}':>7}{_med(x.long_leads_h):>9}{x.healthy_p30_max:>11.3f}"
        )
    kinds: dict[str, list[float | None]] = {}
    for x in summaries:
        for k, v in x.other_delays.items():
            kinds.setdefault(k, []).extend(v)
    lines.append("\nother faults: detected / injected, median time to detect")
    for k, delays in sorted(kinds.items()):
        found = [d for d in delays if d is not None]
        lines.append(f"  {k:<20}{len(found):>3}/{len(delays):<3}{_med(found, 60, ' min'):>12}")
    lines.append(
        "\nthe remediator (dry-run, the committed policy, approvals after 30 min): plans, held by breaker,"
        " healthy GPUs cordoned, hard faults acted on / cordoned, median fault to cordon / drain"
    )
    for x in summaries:
        lines.append(
            f"  {x.scenario:<18}{x.seed:>5}{x.plans:>6}{x.plans_held_by_breaker:>6}{x.healthy_cordoned:>6}"
            f"{f'{x.hard_acted}/{x.hard_faults}':>8}{f'{x.hard_cordoned}/{x.hard_faults}':>8}"
            f"{_med(x.cordon_delays_s, 60, ' min'):>10}{_med(x.drain_delays_s, 60, ' min'):>10}"
        )
    cal = total["calibration"]
    lines.append(f"\ncalibration of p(fail 30 d) over {cal['n']} predictions before a failure: "
                 f"Brier {cal['brier'] if cal['brier'] is None else round(cal['brier'], 4)}")  # fmt: skip
    lines.append(f"  {'p30 bin':<10}{'n':>7}{'mean p':>9}{'observed':>10}")
    for row in cal["table"]:
        lines.append(f"  {row['bin']:<10}{row['n']:>7}{row['mean_p']:>9.3f}{row['observed']:>10.3f}")
    lines += ["", *shared_lines(total)]
    lines += ["", *agreement_lines(rules)]
    threshold = rules.prediction.threshold
    lines.append(f"\nsuite (threshold p30 >= {threshold:g}): precision {_pct(total['precision'])}, "
                 f"recall before failure {_pct(total['recall_before_failure'])} (precursor >= 48 h ahead: "
                 f"{_pct(total['recall_long_lead'])}), median lead {total['median_lead_h_long'] or 0:.1f} h, "
                 f"max p30 on healthy GPUs {total['healthy_p30_max']:.3f}")  # fmt: skip
    for name, ok in total["targets"].items():
        lines.append(f"  [{'n/a' if ok is None else 'ok' if ok else 'MISSED'}] {name}")
    misses = [f"  {x.scenario} seed {x.seed}: {m}" for x in summaries for m in x.misses]
    if misses:
        lines += ["\nwhat went wrong:", *misses]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--scenario", type=Path, help="a scenario JSON file (default: the generated suite)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="seeds to run (default: the file's, or 101 102 103)"
    )
    parser.add_argument("--hours", type=float, default=72.0, help="simulated hours of the generated suite")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    parser.add_argument(
        "--write-scenario", type=Path, help="write the generated scenario of the first seed here"
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--flood-lines", type=int, default=100_000, help="lines of the flood through Kafka (0: no flood run)"
    )
    args = parser.parse_args(argv)
    if args.flood_lines < 0:
        parser.error("--flood-lines is a number of lines, 0 or more")
    rules = load_rules(args.rules)
    if args.scenario:
        scenario = load_scenario(args.scenario)
        runs = [(scenario, seed) for seed in (args.seeds or scenario.seeds)]
    else:
        runs = suite(tuple(args.seeds or EVAL_SEEDS), hours=args.hours)
    if args.write_scenario:
        args.write_scenario.write_text(runs[0][0].to_json())
    overlap = {seed for _, seed in runs} & set(rules.predictor.trained_on_seeds)
    if overlap:
        print(f"warning: the predictor was fitted on seeds {sorted(overlap)}: its figures are not honest")
    summaries, total = evaluate(Settings(), runs, rules)
    print(render(summaries, total, rules))
    if args.flood_lines > 0:
        settings = Settings()
        print(evaluate_floods(settings.kafka, settings.db, lines=args.flood_lines))
    if args.json:
        figures = {"runs": [{k: v for k, v in asdict(x).items() if k != "calibration"} for x in summaries],
                   "totals": total}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=1, default=asdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m evaluation` (`make evaluate`): how well does the scorer tell the truth about a fleet?

Runs the real pipeline (mock fleet -> collector -> Kafka -> sink -> TimescaleDB
-> scorer) on simulated time against a scenario of injected faults and healthy
GPUs, scores the fleet every few simulated minutes, and compares the verdicts
with the mock's ground truth:

- per fault type: detection rate and time to detect (fault start to the first
  non-healthy verdict of the subsystem the fault belongs to; for a hang, the
  idle-while-allocated alert);
- false alarms: healthy GPUs that were ever judged unhealthy (or degraded);
- prediction: precision and recall of p(fail in 30 days) >= threshold for the
  GPUs with a degrading fault, and the lead time between the first such
  prediction and the GPU's first unhealthy verdict.

Needs the services of `make services`; uses its own topics and schema and
drops them afterwards.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from evaluation.pipeline import Pipeline, pipeline
from shared.config import Settings, TopicSettings
from shared.kafka import make_admin, wait_for_kafka
from shared.migrate import migrated_schema
from shared.topics import TopicSpec, ensure_topics

# (kind, params) per faulted GPU; the rest of the fleet stays healthy.
SCENARIO: list[tuple[str, dict[str, float]]] = [
    ("sbe_storm", {}),  # 20/h, growing: degrades over hours
    ("dbe", {}),
    ("row_remap_failure", {}),
    ("xid", {"code": 79}),
    ("xid", {"code": 94}),
    ("thermal_runaway", {"c_per_minute": 2}),
    ("power_brake", {}),
    ("pcie_replay_storm", {"replays_per_minute": 50}),
    ("nvlink_errors", {}),
    ("fall_off_bus", {"scrape_delay_s": 0}),
    ("retired_pages", {}),  # Volta: accumulates towards the 63-page limit
    ("pending_retirement", {}),
]
DEGRADING = {"sbe_storm", "retired_pages", "dbe", "row_remap_failure", "pending_retirement"}


@dataclass(slots=True)
class Observed:
    first_bad: dict[str, datetime] = field(default_factory=dict)  # subsystem -> first non-healthy
    first_unhealthy: datetime | None = None
    first_predicted: datetime | None = None
    alerts: set[str] = field(default_factory=set)


def place(p: Pipeline) -> list[tuple[int, int, str, dict[str, float]]]:
    """Each fault on its own GPU, on a model that has the feature it needs."""
    slots = [(n.index, g.index, g.model) for n in p.fleet.nodes for g in n.gpus]
    placed, used = [], set()
    for kind, params in SCENARIO:
        for node, gpu, model in slots:
            if (node, gpu) in used:
                continue
            if kind in ("retired_pages", "pending_retirement") and not model.page_retirement:
                continue
            if kind == "row_remap_failure" and not model.row_remapping:
                continue
            placed.append((node, gpu, kind, params))
            used.add((node, gpu))
            break
    return placed


def observe(p: Pipeline, seen: dict[str, Observed], threshold: float) -> None:
    result = p.score()
    at = result.as_of
    for uuid_, sub, state in p.query("SELECT gpu_uuid, subsystem, state FROM gpu_health_current"):
        o = seen.setdefault(str(uuid_), Observed())
        if state != "healthy":
            o.first_bad.setdefault(str(sub), at)
        if state == "unhealthy" and o.first_unhealthy is None:
            o.first_unhealthy = at
    for uuid_, p30 in p.query(
        "SELECT gpu_uuid, max(p_fail_30d) FROM gpu_failure_predictions WHERE time = %s GROUP BY gpu_uuid", at
    ):
        o = seen.setdefault(str(uuid_), Observed())
        if float(p30) >= threshold and o.first_predicted is None:
            o.first_predicted = at
    for uuid_, kind in p.query("SELECT gpu_uuid, kind FROM gpu_alerts"):
        seen.setdefault(str(uuid_), Observed()).alerts.add(str(kind))


def evaluate(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    topics = TopicSettings(metrics_raw=f"eval-raw-{suffix}", events=f"eval-events-{suffix}")
    admin = make_admin(settings.kafka)
    ensure_topics(admin, [TopicSpec(t, 3, 1) for t in (topics.metrics_raw, topics.events)])
    try:
        with (
            migrated_schema(settings.db, "eval") as db,
            pipeline(
                settings.kafka, db, topics, nodes=args.nodes, gpus=args.gpus, hours_back=args.hours + 1
            ) as p,
        ):
            faults = []
            for node, gpu, kind, params in place(p):
                p.inject(node=node, gpu=gpu, kind=kind, params=params, after_s=args.faults_after_h * 3600)
                faults.append((p.gpu(node, gpu), kind))
            seen: dict[str, Observed] = {}
            steps = int(args.hours * 3600 // args.score_every_s)
            for _ in range(steps):
                p.run(args.score_every_s, step_s=args.step_s)
                observe(p, seen, args.threshold)
            truth = p.fleet.ground_truth()["faults"]
            all_gpus = [g.uuid for n in p.fleet.nodes for g in n.gpus]
    finally:
        admin.delete_topics([topics.metrics_raw, topics.events])
    return summarise(truth, seen, all_gpus)


def summarise(truth: list[dict[str, Any]], seen: dict[str, Observed], all_gpus: list[str]) -> dict[str, Any]:
    per_kind: dict[str, list[float | None]] = {}
    for f in truth:
        o = seen.get(f["gpu_uuid"], Observed())
        start = datetime.fromisoformat(f["start"])
        if f["subsystem"]:
            detected_at = o.first_bad.get(f["subsystem"])
        else:  # a hang has no subsystem: its finding is the idle-while-allocated alert
            detected_at = start if "idle_while_allocated" in o.alerts else None
        delay = (detected_at - start).total_seconds() if detected_at and detected_at >= start else None
        name = f["kind"] if f["kind"] != "xid" else f"xid_{int(f['params']['code'])}"
        per_kind.setdefault(name, []).append(delay)
    faulty = {f["gpu_uuid"] for f in truth}
    healthy = [g for g in all_gpus if g not in faulty]
    false_unhealthy = [g for g in healthy if seen.get(g, Observed()).first_unhealthy]
    false_degraded = [g for g in healthy if seen.get(g, Observed()).first_bad]
    degrading = {f["gpu_uuid"] for f in truth if f["kind"] in DEGRADING}
    predicted = {g for g, o in seen.items() if o.first_predicted}
    tp, fp, fn = len(predicted & degrading), len(predicted - degrading), len(degrading - predicted)
    leads = [
        (o.first_unhealthy - o.first_predicted).total_seconds() / 3600
        for g in degrading & predicted
        if (o := seen[g]).first_unhealthy and o.first_predicted and o.first_predicted <= o.first_unhealthy
    ]
    return {
        "per_kind": per_kind,
        "healthy_gpus": len(healthy),
        "false_unhealthy": len(false_unhealthy),
        "false_degraded": len(false_degraded),
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
        "lead_hours": leads,
    }


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--hours", type=float, default=6.0, help="simulated hours to run")
    parser.add_argument(
        "--faults-after-h", type=float, default=1.0, help="faults begin after this many hours"
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=60.0, help="simulated seconds between polls")
    parser.add_argument(
        "--score-every-s", type=float, default=600.0, help="simulated seconds between scorings"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.2, help="p(fail in 30 days) that counts as a prediction"
    )
    args = parser.parse_args()
    settings = Settings()
    wait_for_kafka(settings.kafka)
    r = evaluate(settings, args)
    print(f"Evaluation: {args.nodes}x{args.gpus} GPUs, {args.hours:g} simulated hours, faults from hour "
          f"{args.faults_after_h:g}, scored every {args.score_every_s:g} s\n")  # fmt: skip
    print(f"{'fault':<22}{'detected':>10}{'time to detect':>18}")
    for kind, delays in sorted(r["per_kind"].items()):
        found = [d for d in delays if d is not None]
        when = f"{sum(found) / len(found) / 60:.1f} min" if found else "-"
        print(f"{kind:<22}{len(found):>5}/{len(delays):<4}{when:>18}")
    print(f"\nfalse alarms on {r['healthy_gpus']} healthy GPUs: {r['false_unhealthy']} unhealthy, "
          f"{r['false_degraded']} degraded or worse")  # fmt: skip
    lead = f"{sum(r['lead_hours']) / len(r['lead_hours']):.1f} h" if r["lead_hours"] else "-"
    print(f"prediction (p30 >= {args.threshold:g}) on degrading GPUs: precision {fmt(r['precision'])}, "
          f"recall {fmt(r['recall'])}, mean lead time before the first unhealthy verdict {lead}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

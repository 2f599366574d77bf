"""Runs one scenario with one seed and records what the scorer said, cycle by cycle."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.collector.enrich import Placement
from services.mock_dcgm.fleet import FleetSpec
from services.scorer.predict import precursor_features, predict_one
from services.scorer.rules_config import Rules
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings
from shared.store import alerts, health

from .feed import SimFeed, sim_feed
from .remediation import ShadowRemediator
from .scenario import Scenario

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Record:
    """Everything a run produced that the metrics read."""

    scenario: str
    seed: int
    poll_s: float
    score_every_s: float
    end_ms: int
    truth: dict[str, Any]
    gpus: list[str]
    # per scoring cycle: (time ms, {gpu: {subsystem: state}} for GPUs not all healthy, {gpu: action})
    cycles: list[tuple[int, dict[str, dict[str, str]], dict[str, str]]] = field(default_factory=list)
    # per prediction: (time ms, {gpu: p_fail_30d})
    predictions: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    # per prediction: (time ms, {gpu: raw precursor inputs}); filled only when asked (training)
    features: list[tuple[int, dict[str, dict[str, float]]]] = field(default_factory=list)
    # per GPU: its highest p_fail_30d, when, and the reasons then (to explain false alarms)
    peaks: dict[str, tuple[float, int, list[dict[str, Any]]]] = field(default_factory=dict)
    # the remediator's dry-run plans (evaluation/remediation.py): GPUs, action, when decided/cordoned/drained
    remediations: list[dict[str, Any]] = field(default_factory=list)
    # per scoring cycle: the open findings of several GPUs (job_crash, node_fault, rack_fault alerts):
    # (time ms, [(kind, job/host/rack, first XID's time, GPU count, GPUs)])
    findings: list[tuple[int, list[tuple[str, str, str, int, tuple[str, ...]]]]] = field(default_factory=list)
    racks: dict[str, str] = field(default_factory=dict)  # hostname -> rack, where the scenario has racks


_SHARED = {"job_crash": "job", "node_fault": "node", "rack_fault": "rack"}  # alert kind -> evidence key


def _snapshot(
    feed: SimFeed,
) -> tuple[dict[str, dict[str, str]], dict[str, str], list[tuple[str, str, str, int, tuple[str, ...]]]]:
    states: dict[str, dict[str, str]] = {}
    with connect(feed.db) as conn:
        for uuid, sub, state, _rule in health.current_verdicts(conn, unhealthy_only=True):
            states.setdefault(uuid, {})[sub] = state
        actions = health.actions(conn)
        shared = alerts.unresolved_of_kinds(conn, _SHARED)
    findings = []
    for kind, evidence in shared:
        findings.append((str(kind), str(evidence[_SHARED[str(kind)]]), str(evidence["first"]),
                         int(evidence["gpu_count"]), tuple(evidence["gpus"])))  # fmt: skip
    return states, actions, findings


def inject_all(feed: SimFeed, faults: list[dict[str, Any]]) -> None:
    for request in faults:
        feed.fleet.inject(dict(request))


def run_scenario(
    db: DatabaseSettings,
    scenario: Scenario,
    seed: int,
    rules: Rules,
    *,
    score: bool = True,
    features: bool = False,
) -> Record:
    """Simulate the scenario's hours; score every score_every_s, predict every predict_every_s.

    With score=False only predictions are made (training reads the model's inputs, not verdicts).
    """
    spec = FleetSpec(nodes=scenario.nodes, gpus_per_node=scenario.gpus_per_node,
                     models=tuple(scenario.models), seed=seed)  # fmt: skip
    with (
        migrated_schema(db, "eval") as scoped,
        sim_feed(scoped, spec, hours=scenario.hours, rules=rules) as feed,
    ):
        racks = {n.hostname: f"rack-{n.index // scenario.hosts_per_rack}"
                 for n in feed.fleet.nodes if scenario.hosts_per_rack}  # fmt: skip
        feed.enricher.inventory = {host: Placement(rack=rack) for host, rack in racks.items()}
        shadow = ShadowRemediator(scoped) if score else None
        inject_all(feed, scenario.faults)
        gpus = [g.uuid for n in feed.fleet.nodes for g in n.gpus]
        step = scenario.score_every_s if score else scenario.predict_every_s
        per_prediction = max(1, round(scenario.predict_every_s / step))
        cycles = int(scenario.hours * 3600 // step)
        rec = Record(scenario=scenario.name, seed=seed, poll_s=scenario.poll_s,
                     score_every_s=scenario.score_every_s,
                     end_ms=0, truth={}, gpus=gpus, racks=racks)  # fmt: skip
        for i in range(1, cycles + 1):
            feed.advance(step, scenario.poll_s)
            now_ms = int(feed.now_s * 1000)
            predict = i % per_prediction == 0
            if score:
                result = feed.score(predict=predict)
                states, actions, findings = _snapshot(feed)
                rec.cycles.append((now_ms, states, actions))
                rec.findings.append((now_ms, findings))
                if shadow is not None:
                    shadow.after_cycle(result.messages, now_ms)
                if predict:
                    rec.predictions.append((now_ms, {u: p.p_fail_30d for u, p in result.predictions.items()}))
                    for u, p in result.predictions.items():
                        if p.p_fail_30d > rec.peaks.get(u, (-1.0, 0, []))[0]:
                            rec.peaks[u] = (p.p_fail_30d, now_ms, p.reasons)
            elif predict:
                as_of = datetime.fromtimestamp(feed.last_poll_s or feed.now_s, UTC)
                with connect(feed.db) as conn:
                    raw = precursor_features(conn, as_of, rules)
                rec.predictions.append((now_ms, {u: predict_one(u, x, rules.predictor).p_fail_30d
                                                 for u, x in raw.items()}))  # fmt: skip
                if features:
                    rec.features.append((now_ms, raw))
        rec.end_ms = int(feed.now_s * 1000)
        rec.truth = feed.fleet.ground_truth()
        if shadow is not None:
            rec.remediations = shadow.timeline()
            shadow.close()
    log.info("ran %s seed %d", scenario.name, seed)
    return rec

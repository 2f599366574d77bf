"""The shipped Prometheus alerting rules: valid, tested with `promtool test rules`, over real series."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from services.remediator.loop import RemediatorMetrics
from services.scorer.verdict_metrics import GpuVerdicts, VerdictCollector, VerdictSnapshot
from services.sink.metrics import SinkMetrics
from tests.paths import REPO

RULES = REPO / "deploy" / "prometheus" / "rules"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False, cwd=REPO, timeout=120)


def test_promtool_test_rules_passes_on_every_rules_test_file(promtool: Path) -> None:
    tests = sorted(RULE_TESTS.glob("*.test.yml"))
    assert tests, "no rules test file"
    out = _run(str(promtool), "test", "rules", *map(str, tests))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_checks_the_rules_and_the_prometheus_config_that_loads_them(promtool: Path) -> None:
    out = _run(str(promtool), "check", "rules", *map(str, sorted(RULES.glob("*.yml"))))
    assert out.returncode == 0, out.stdout + out.stderr
    out = _run(str(promtool), "check", "config", str(REPO / "deploy" / "prometheus" / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(list(RULES.glob('*.yml')))} rule files found" in out.stdout


def test_every_alert_is_unit_tested() -> None:
    alerts = {r["alert"] for f in RULES.glob("*.yml") for g in yaml.safe_load(f.read_text())["groups"]
              for r in g["rules"] if "alert" in r}  # fmt: skip
    tested = {
        t["alertname"]
        for f in RULE_TESTS.glob("*.test.yml")
        for case in yaml.safe_load(f.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert alerts
    assert alerts == tested


def test_the_rules_query_only_series_the_services_expose(promtool: Path) -> None:
    registry = CollectorRegistry()
    RemediatorMetrics(registry)  # the remediator's own series
    verdicts = VerdictCollector()
    registry.register(verdicts)
    verdicts.replace(VerdictSnapshot(
        as_of=datetime(2026, 1, 1, tzinfo=UTC),
        gpus={"GPU-1": GpuVerdicts("node-1", "unhealthy", 20.0, {"memory": "unhealthy"}, {"critical": 1})},
    ))  # fmt: skip
    exposed = generate_latest(registry).decode()
    sink = CollectorRegistry()  # the sink's (not linted below: a count of rollup minutes is no duration)
    SinkMetrics(sink)
    names = set(re.findall(r"^# TYPE (\S+) ", exposed + generate_latest(sink).decode(), re.M))
    used = {
        m
        for f in RULES.glob("*.yml")
        for m in re.findall(r"\b(gpuhealth_[a-z_]+)", f.read_text())
        if not m.endswith("_total")  # counters named in prose (descriptions)
    }
    assert used
    assert used <= names, used - names
    check = subprocess.run([str(promtool), "check", "metrics"], input=exposed, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not (check.stdout + check.stderr).strip(), check.stdout + check.stderr

"""The scorer's verdict series: bounded labels, numeric states, GPUs that leave take their series along."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.scorer.verdict_metrics import SEVERITIES, GpuVerdicts, VerdictCollector, VerdictSnapshot

STATES = ("healthy", "degraded", "unhealthy")
SUBS = ("memory", "thermal", "power", "pcie", "nvlink", "xid", "availability")


def _scrape(collector: VerdictCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


gpu = st.builds(
    GpuVerdicts,
    hostname=st.text(min_size=1, max_size=30),
    state=st.sampled_from(STATES),
    score=st.floats(0, 100),
    subsystems=st.dictionaries(st.sampled_from(SUBS), st.sampled_from(STATES)),
    open_alerts=st.dictionaries(st.sampled_from(SEVERITIES), st.integers(1, 50)),
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=40), gpu, max_size=12))
def test_series_per_gpu_are_bounded_and_carry_the_verdicts(gpus: dict[str, GpuVerdicts]) -> None:
    c = VerdictCollector()
    c.replace(VerdictSnapshot(as_of=datetime(2026, 3, 1, tzinfo=UTC), gpus=gpus))
    series = _scrape(c)
    code = {"healthy": 0, "degraded": 1, "unhealthy": 2}
    state = {(lab["gpu_uuid"], lab["hostname"]): v for lab, v in series.get("gpuhealth_gpu_state", [])}
    assert state == {(u, g.hostname): code[g.state] for u, g in gpus.items()}
    subs = {
        (lab["gpu_uuid"], lab["subsystem"]): v for lab, v in series.get("gpuhealth_gpu_subsystem_state", [])
    }
    assert subs == {(u, s): code[v] for u, g in gpus.items() for s, v in g.subsystems.items()}
    alerts = series.get("gpuhealth_gpu_open_alerts", [])
    assert len(alerts) == len(gpus) * len(SEVERITIES)  # every severity, zeros included: no gaps to alert on
    for lab, v in alerts:
        assert set(lab) == {"gpu_uuid", "hostname", "severity"}
        assert v == gpus[lab["gpu_uuid"]].open_alerts.get(lab["severity"], 0)
    total = sum(len(v) for k, v in series.items() if k.startswith("gpuhealth_gpu_"))
    assert total <= len(gpus) * (2 + len(SUBS) + len(SEVERITIES))
    assert series["gpuhealth_verdicts_gpus"] == [({}, len(gpus))]
    assert series["gpuhealth_verdicts_as_of_seconds"] == [({}, datetime(2026, 3, 1, tzinfo=UTC).timestamp())]


def test_a_gpu_that_leaves_takes_its_series_along() -> None:
    c = VerdictCollector()
    both = {
        "GPU-a": GpuVerdicts("n1", "healthy", 100, {"memory": "healthy"}),
        "GPU-b": GpuVerdicts("n2", "unhealthy", 10, {"memory": "unhealthy"}, {"critical": 1}),
    }
    c.replace(VerdictSnapshot(as_of=datetime(2026, 3, 1, tzinfo=UTC), gpus=both))
    assert {lab["gpu_uuid"] for lab, _ in _scrape(c)["gpuhealth_gpu_health_score"]} == {"GPU-a", "GPU-b"}
    c.replace(VerdictSnapshot(as_of=datetime(2026, 3, 1, 0, 1, tzinfo=UTC), gpus={"GPU-a": both["GPU-a"]}))
    after = _scrape(c)
    for name, samples in after.items():
        assert all(lab.get("gpu_uuid") != "GPU-b" for lab, _ in samples), name


def test_before_the_first_cycle_nothing_per_gpu_is_exposed() -> None:
    series = _scrape(VerdictCollector())
    assert series["gpuhealth_verdicts_as_of_seconds"] == [({}, 0.0)]
    assert not any(k.startswith("gpuhealth_gpu_") for k in series)

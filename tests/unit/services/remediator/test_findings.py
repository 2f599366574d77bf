"""Verdicts and alerts as findings (their idempotence keys, their actions) and the node map."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.remediator.findings import from_alert, from_verdict, load_node_map, valid_node
from services.remediator.policy import load_policy
from shared.contract.models_health import AlertOpened, AlertResolved, HealthVerdict
from shared.plumbing.errors import ConfigError

GPU = "GPU-00000001-0000-4000-8000-000000000000"
T = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def verdict(**changes: object) -> HealthVerdict:
    fields: dict[str, object] = {
        "time": T,
        "gpu_uuid": GPU,
        "hostname": "gpu-node-00",
        "subsystem": "xid",
        "state": "unhealthy",
        "previous": "healthy",
        "rule": "xid_79",
        "action": "reset_gpu",
        "evidence": {"xid": 79},
    }
    return HealthVerdict(**(fields | changes))  # type: ignore[arg-type]


def test_a_verdict_is_keyed_by_its_gpu_subsystem_and_cycle() -> None:
    finding = from_verdict(verdict(), "gpu-health")
    assert finding.decision_key == f"gpu-health/{GPU}/xid/2026-11-20T12:00:00Z"
    assert (finding.action, finding.name, finding.hostname) == ("reset_gpu", "xid_79", "gpu-node-00")
    assert finding.message["evidence"] == {"xid": 79}
    assert from_verdict(verdict(), "gpu-health") == finding  # the same message, the same key
    later = from_verdict(verdict(time=T.replace(minute=1)), "gpu-health")
    assert later.decision_key != finding.decision_key


def test_a_healthy_verdict_calls_for_nothing() -> None:
    finding = from_verdict(verdict(state="healthy", rule=None, action="none"), "gpu-health")
    assert finding.action == "none"
    assert finding.name == "xid_healthy"


def test_an_alert_acts_only_where_the_policy_lists_its_kind() -> None:
    policy = load_policy()
    opened = AlertOpened(
        time=T,
        alert_id=7,
        gpu_uuid=GPU,
        hostname="gpu-node-00",
        kind="thermal",
        severity="critical",
        state="open",
        summary="hot",
        evidence={},
    )
    assert from_alert(opened, "gpu-alerts", policy).action == "none"
    listing = policy.model_copy(update={"alerts": {"scorer:thermal": "reset_gpu"}})
    finding = from_alert(opened, "gpu-alerts", listing)
    assert (finding.action, finding.decision_key) == ("reset_gpu", "gpu-alerts/scorer/7/open")
    resolved = AlertResolved(time=T, alert_id=7, gpu_uuid=GPU, hostname="", kind="thermal", state="resolved")
    assert from_alert(resolved, "gpu-alerts", listing).action == "none"


def test_the_node_map_overrides_the_hostname_and_names_the_node_per_scheduler(tmp_path: Path) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text(f'[gpus]\n"{GPU}" = "host-b"\n[hosts.host-b]\nkubernetes = "k8s-b"\nslurm = "b"\n')
    nodes = load_node_map(path)
    assert nodes.hostname(GPU, "host-a") == "host-b"
    assert nodes.hostname("GPU-other-000000", "host-a") == "host-a"
    assert nodes.scheduler_name("host-b", "kubernetes") == "k8s-b"
    assert nodes.scheduler_name("host-b", "slurm") == "b"
    assert nodes.scheduler_name("host-c", "slurm") == "host-c"
    assert load_node_map(None).hostname(GPU, "x") == "x"


@pytest.mark.parametrize(
    "text",
    [
        '[gpus]\n"not-a-gpu" = "h"\n',
        '[gpus]\n"GPU-00000001-0000" = "bad host;rm"\n',
        '[hosts.h]\nkubernetes = "UPPER_and spaces"\n',
        "[unknown]\n",
        "[gpus\n",
    ],
)
def test_a_bad_node_map_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_node_map(path)


@given(st.text(max_size=300))
def test_a_node_name_never_carries_what_a_scheduler_cannot(name: str) -> None:
    if valid_node(name):
        assert 0 < len(name) <= 253
        assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)

"""The remediation policy: the committed file loads and covers the ladder; a wrong one is refused with why."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.remediator.policy import DEFAULT_POLICY, Breaker, NodesOut, load_policy
from shared.contract.models_health import LADDER
from shared.plumbing.errors import ConfigError

POLICY_TEXT = DEFAULT_POLICY.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_the_committed_policy_loads_and_lists_every_action_of_the_ladder() -> None:
    policy = load_policy()
    assert set(policy.actions) == set(LADDER)
    assert policy.for_action("none").mode == "never"
    assert policy.for_action("reset_gpu").steps == ("cordon", "drain", "reset_gpu", "validate", "return")
    assert policy.drain.mode("kube-system") == "skip"
    assert policy.drain.mode("anything-else") == "evict"
    # a failed validation climbs the ladder to a person, or to repair
    assert policy.for_action("reset_gpu").on_failure == "reboot_node"
    assert policy.for_action("reboot_node").on_failure == "inspect"
    assert policy.for_action("run_diagnostics").on_failure == "send_for_repair"
    assert policy.for_action("send_for_repair").steps[-1] == "keep_out"


def test_an_action_off_the_ladder_is_never_acted_on() -> None:
    assert load_policy().for_action("launch_missiles").mode == "never"


def test_a_policy_missing_an_action_of_the_ladder_is_refused(tmp_path: Path) -> None:
    text = POLICY_TEXT.replace("[actions.inspect]", "[actions.inspect_not]")
    with pytest.raises(ConfigError, match=r"missing \['inspect'\].*unknown \['inspect_not'\]"):
        load_policy(write(tmp_path, text))


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ('["drain", "cordon"]', "steps must come in the order"),
        ('["cordon", "return"]', "'return' needs 'validate'"),
        ('["reset_gpu"]', "needs the node cordoned first"),
        ('["cordon", "cordon"]', "listed twice"),
        ('["cordon", "drain", "validate", "return", "keep_out"]', "not both"),
        ('["reboot_the_world"]', "steps"),
        ("[]", "needs steps"),
    ],
)
def test_an_incoherent_plan_is_refused(tmp_path: Path, steps: str, message: str) -> None:
    text = POLICY_TEXT.replace(
        'steps = ["cordon", "drain", "reset_gpu", "validate", "return"]', f"steps = {steps}"
    )
    with pytest.raises(ConfigError, match=message):
        load_policy(write(tmp_path, text))


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("max_nodes = 10", "max_nodes = 0", "breaker.max_nodes"),
        ("max_fleet_percent = 10.0", "max_fleet_percent = 150.0", "breaker.max_fleet_percent"),
        ("per_node = 2", 'per_node = "two"', "rate_limit.per_node"),
        ('default_mode = "evict"', 'default_mode = "delete"', "drain.default_mode"),
        ('kube-system = "skip"', '"Kube System!" = "skip"', "drain.namespaces"),
        ("healthy_cycles = 3", "healthy_cycles = -3", "validation.healthy_cycles"),
        ('mode = "approval"', 'mode = "yolo"', "actions.reboot_node.mode"),
        ("version = 1", "version = 2", "version"),
        ("[alerts]", '[alerts]\n"scorer:thermal" = "format_disk"', "alerts"),
        ('on_failure = "reboot_node"', 'on_failure = "restart_workload"', "on_failure"),
        ('on_failure = "reboot_node"', 'on_failure = "pray"', "on_failure"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(tmp_path: Path, old: str, new: str, where: str) -> None:
    assert old in POLICY_TEXT
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_policy(write(tmp_path, POLICY_TEXT.replace(old, new, 1)))


def test_an_unreadable_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(write(tmp_path, "version = [1"))
    with pytest.raises(ConfigError, match="unknown_section"):
        load_policy(write(tmp_path, POLICY_TEXT + "\n[unknown_section]\n"))


@given(
    max_nodes=st.integers(1, 100_000),
    percent=st.floats(0.001, 100, allow_nan=False),
    fleet=st.integers(-5, 1_000_000),
)
def test_the_breaker_bound_and_the_cap_are_the_smaller_bound_and_never_below_one(
    max_nodes: int, percent: float, fleet: int
) -> None:
    for bounds in (
        Breaker(max_nodes=max_nodes, max_fleet_percent=percent, window_s=60),
        NodesOut(max_nodes=max_nodes, max_fleet_percent=percent),
    ):
        bound = bounds.bound(fleet)
        assert 1 <= bound <= max_nodes
        assert bound == 1 or bound <= max(fleet, 0) * percent / 100
        assert bounds.bound(fleet + 100) >= bound  # a bigger fleet never lowers the bound


def test_the_committed_cap_bounds_the_nodes_out_beside_the_breaker() -> None:
    policy = load_policy()
    assert (policy.nodes_out.max_nodes, policy.nodes_out.max_fleet_percent) == (20, 10.0)
    assert policy.nodes_out.bound(40) == 4
    assert policy.nodes_out.bound(10_000) == 20


def test_a_policy_without_the_cap_is_refused(tmp_path: Path) -> None:
    text = POLICY_TEXT.replace("[nodes_out]", "[unused]")
    with pytest.raises(ConfigError, match="nodes_out"):
        load_policy(write(tmp_path, text))


def test_a_training_jobs_alert_can_never_be_made_to_act(tmp_path: Path) -> None:
    """Training jobs publish their alerts unsigned: the policy cannot name one."""
    text = POLICY_TEXT + '"training:thermal" = "inspect"\n'
    with pytest.raises(ConfigError, match="not signed"):
        load_policy(write(tmp_path, text))


def test_the_committed_policy_starts_a_held_reboot_that_a_reset_joins_and_nothing_else() -> None:
    policy = load_policy()
    assert policy.for_action("reboot_node").starts_when_joined
    assert policy.for_action("reboot_node").mode == "approval"  # a reboot on its own still waits
    assert [a for a, rules in policy.actions.items() if rules.starts_when_joined] == ["reboot_node"]


@given(mode=st.sampled_from(["automatic", "approval", "never"]), joined=st.booleans())
def test_starts_when_joined_is_only_for_an_action_that_waits_for_approval(mode: str, joined: bool) -> None:
    text = POLICY_TEXT.replace(
        'mode = "approval"\nstarts_when_joined = true',
        f'mode = "{mode}"\nstarts_when_joined = {str(joined).lower()}',
    )
    assert text != POLICY_TEXT or (mode, joined) == ("approval", True)
    with tempfile.TemporaryDirectory() as folder:  # hypothesis runs many examples: no tmp_path
        path = write(Path(folder), text)
        if joined and mode != "approval":
            with pytest.raises(ConfigError, match=r"actions\.reboot_node.*starts_when_joined"):
                load_policy(path)
        else:
            assert load_policy(path).for_action("reboot_node").starts_when_joined is joined

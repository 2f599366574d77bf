"""`make up`'s stack file follows scripts/env.sh, and the compose test's ports stay off the native stack's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from scripts.supervise import expand, load, ready_urls
from tests.paths import REPO

SPEC = REPO / "deploy" / "local-stack.toml"
# scripts/env.sh's port variables and their defaults: the native stack.
NATIVE = {
    "GPUHEALTH_KAFKA_PORT": 9092, "GPUHEALTH_KAFKA_CONTROLLER_PORT": 9093, "GPUHEALTH_PG_PORT": 55432,
    "GPUHEALTH_MOCK_ADMIN_PORT": 9399, "GPUHEALTH_MOCK_BASE_PORT": 9400,
    "GPUHEALTH_COLLECTOR_METRICS_PORT": 9500, "GPUHEALTH_SINK_METRICS_PORT": 9501,
    "GPUHEALTH_SCORER_METRICS_PORT": 9502, "GPUHEALTH_API_PORT": 8000,
}  # fmt: skip
NATIVE_PORTS = {*NATIVE.values(), 9401, 9402, 9403}


def env_sh(overrides: dict[str, str]) -> dict[str, str]:
    """The environment scripts/env.sh exports, from a clean one plus `overrides`."""
    done = subprocess.run(
        ["bash", "-c", f"source {REPO}/scripts/env.sh && env -0"],
        env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin", **overrides},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)


def stack_text(environ: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    children = load(SPEC, tmp_path)
    return " ".join([*ready_urls(SPEC), *(f"{c.command} {c.env}" for c in children)])


def test_the_stack_uses_env_sh_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = stack_text(env_sh({}), tmp_path, monkeypatch)
    for port in (9399, 9400, 9401, 9402, 9403, 9500, 9501, 9502, 8000):
        assert f":{port}" in text or f"'{port}'" in text, port


def test_every_port_and_url_of_the_stack_follows_env_sh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = {name: str(port + 20000) for name, port in NATIVE.items()}
    environ = env_sh(moved)
    assert environ["GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS"] == "127.0.0.1:29092"
    assert environ["GPUHEALTH_DB__PORT"] == "75432"
    text = stack_text(environ, tmp_path, monkeypatch)
    for port in NATIVE_PORTS - {9092, 9093, 55432}:
        assert not re.search(rf"(?<!\d){port}(?!\d)", text), (
            f"{port} is written into the stack file, not env.sh's"
        )
        assert str(port + 20000) in text, f"{port + 20000} (moved from {port}) is not used"


def test_settings_set_explicitly_win_over_env_sh() -> None:
    environ = env_sh({"GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": "broker:9092", "GPUHEALTH_KAFKA_PORT": "19092"})
    assert environ["GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS"] == "broker:9092"


NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True)


@given(text=st.text().filter(lambda t: "$" not in t))
def test_expand_leaves_text_without_a_dollar_alone(text: str) -> None:
    assert expand(text, {}) == text


@given(name=NAMES, value=st.text(), prefix=st.text().filter(lambda t: "$" not in t))
def test_expand_substitutes_a_set_name(name: str, value: str, prefix: str) -> None:
    assert expand(f"{prefix}${{{name}}}/x", {name: value}) == f"{prefix}{value}/x"


@given(name=NAMES)
def test_expand_refuses_a_name_that_is_not_set(name: str) -> None:
    with pytest.raises(KeyError):
        expand(f"http://127.0.0.1:${{{name}}}/", {})


def test_n_scorers_are_n_children_each_on_its_own_metrics_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = env_sh({"GPUHEALTH_SCORERS": "3"})
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    children = load(SPEC, tmp_path)
    scorers = {c.name: c.env["GPUHEALTH_SCORER__METRICS_PORT"] for c in children if "scorer" in c.name}
    assert scorers == {"scorer-0": "9502", "scorer-1": "9512", "scorer-2": "9522"}
    urls = ready_urls(SPEC)
    assert {f"http://127.0.0.1:{port}/metrics" for port in (9502, 9512, 9522)} <= set(urls)
    ports = {int(m) for u in urls for m in re.findall(r":(\d+)/", u)}
    assert len(ports) == len(urls)  # no two children on one port
    assert not ({9512, 9522} & NATIVE_PORTS)
    monkeypatch.setenv("GPUHEALTH_SCORERS", "1")
    assert [c.name for c in load(SPEC, tmp_path) if "scorer" in c.name] == ["scorer"]  # one keeps its name


@given(
    base=st.integers(1, 60000), step=st.integers(0, 100), replica=st.integers(0, 63),
    prefix=st.text().filter(lambda t: "$" not in t),
)  # fmt: skip
def test_a_replica_moves_a_number_by_its_step(base: int, step: int, replica: int, prefix: str) -> None:
    value = expand(f"{prefix}${{PORT+REPLICA*{step}}}", {"PORT": str(base)}, replica)
    assert value == f"{prefix}{base + replica * step}"
    assert expand("${REPLICA}", {}, replica) == str(replica)


@pytest.mark.parametrize("replicas", ["0", "65", "two", "-1", ""])
def test_a_replica_count_out_of_range_is_refused(tmp_path: Path, replicas: str) -> None:
    spec = tmp_path / "stack.toml"
    spec.write_text(f'[process.p]\ncommand = ["true"]\nreplicas = "{replicas}"\n')
    with pytest.raises(ValueError, match="replicas must be 1 to 64"):
        load(spec, tmp_path)


def test_a_moved_number_that_is_no_number_is_refused() -> None:
    with pytest.raises(ValueError, match="not a number"):
        expand("${PORT+REPLICA*10}", {"PORT": "http"}, 1)


def test_the_compose_test_publishes_no_native_port() -> None:
    override = yaml.safe_load(
        (REPO / "deploy/docker/compose.local-images.yml").read_text().replace("!override", "")
    )
    published: set[int] = set()
    for service in override["services"].values():
        for mapping in service.get("ports", []) if isinstance(service, dict) else []:
            host = mapping.split(":")[1]
            first, _, last = host.partition("-")
            published |= set(range(int(first), int(last or first) + 1))
    assert published, "the override publishes nothing"
    assert not published & NATIVE_PORTS
    script = (REPO / "scripts" / "compose-test.sh").read_text()
    checked = {int(p) for p in re.search(r"test_ports=\(([\d ]+)\)", script).group(1).split()}  # type: ignore[union-attr]
    assert checked == published - {13000}, "compose-test.sh must check every port the override publishes"

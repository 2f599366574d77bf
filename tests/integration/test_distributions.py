"""Each distribution builds from its pyproject.toml and works installed, away from the checkout.

The users' library (gpuhealth/, `gpuhealth-training`) goes into a fresh venv
with only the dependencies it declares, fetched by pip (from PyPI or pip's
cache): it imports, finds its rules file, and has no `shared` or `services`
beside it. The pipeline (pyproject.toml, `gpu-health`) goes into another fresh
venv with the library's wheel; their third-party dependencies are lent by the
development venv (a .pth file) rather than fetched again, which keeps this to
about a minute. Every console script it declares answers --help.

Both builds run on copies of the sources, so nothing is written into the
checkout, and every command runs outside it with no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhealth.training import AndonThresholds
from tests.paths import REPO

RULES = REPO / "config" / "health-rules.toml"

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]

BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "*.so", "*.so.stamp")


@dataclass(frozen=True)
class Wheels:
    library: Path
    pipeline: Path


def run(*command: str | Path, cwd: Path, timeout_s: float = 300) -> str:
    """Run a command outside the checkout, without PYTHONPATH; its output, or a failure that shows it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    shown = " ".join(map(str, command))
    assert done.returncode == 0, f"{shown} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def venv(at: Path) -> Path:
    """A fresh venv from the base interpreter; its python."""
    run(sys.executable, "-m", "venv", at, cwd=at.parent)
    return at / "bin" / "python"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    work = tmp_path_factory.mktemp("distributions")
    library_src = work / "library-src"
    shutil.copytree(
        REPO / "gpuhealth", library_src, ignore=BUILD_LEFTOVERS
    )  # the rules link copied as a file
    pipeline_src = work / "pipeline-src"
    for tree in ("services", "shared"):
        shutil.copytree(REPO / tree, pipeline_src / tree, ignore=BUILD_LEFTOVERS)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, pipeline_src / name)
    out = work / "wheels"
    for src in (library_src, pipeline_src):
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, src, cwd=work)
    (library,) = out.glob("gpuhealth_training-*.whl")
    (pipeline,) = out.glob("gpu_health-*.whl")
    return Wheels(library, pipeline)


def test_the_library_installs_alone_with_what_it_declares(wheels: Wheels, tmp_path: Path) -> None:
    python = venv(tmp_path / "training-job")
    run(python, "-m", "pip", "install", "--quiet", wheels.library, cwd=tmp_path)
    run(python, "-m", "pip", "check", cwd=tmp_path)
    check = """
import importlib.metadata, importlib.util, json, sys
import gpuhealth.training as t
from gpuhealth.training import AndonChecker, AndonThresholds, sparkline
from gpuhealth.andon_rules import DEFAULT_RULES
print(json.dumps({
    "alone": [m for m in ("shared", "services") if importlib.util.find_spec(m) is not None],
    "from": t.__file__,
    "rules": DEFAULT_RULES.read_text(),
    "memory": AndonChecker().thresholds.memory_used_ratio,
    "line": sparkline([1, 2, None, 4], width=4),
    "kafka_loaded": "confluent_kafka" in sys.modules,
    "readme": importlib.metadata.metadata("gpuhealth-training").json.get("description", ""),
}))
"""
    seen = json.loads(run(python, "-c", check, cwd=tmp_path))
    assert seen["alone"] == []
    assert Path(seen["from"]).is_relative_to(tmp_path / "training-job")
    assert seen["rules"] == RULES.read_text()  # the reviewed file itself, not the link
    assert seen["memory"] == AndonThresholds.from_rules(RULES).memory_used_ratio
    assert len(seen["line"]) == 4
    assert seen["kafka_loaded"] is False
    assert seen["readme"] == (REPO / "gpuhealth" / "README.md").read_text()  # its own, not the pipeline's


def console_scripts() -> list[str]:
    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def test_the_pipeline_installs_with_the_library_and_each_command_answers_help(
    wheels: Wheels, tmp_path: Path
) -> None:
    python = venv(tmp_path / "pipeline")
    both = (wheels.library, wheels.pipeline)
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", *both, cwd=tmp_path)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run(python, "-c", purelib, cwd=tmp_path).strip())
    (site / "dev-venv-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    packages = (
        "import gpuhealth, services, shared; print(gpuhealth.__file__, services.__file__, shared.__file__)"
    )
    where = run(python, "-c", packages, cwd=tmp_path)
    assert all(Path(p).is_relative_to(site) for p in where.split()), where
    assert console_scripts(), "the pipeline declares no console script"
    for script in console_scripts():
        usage = run(tmp_path / "pipeline" / "bin" / script, "--help", cwd=tmp_path, timeout_s=60)
        assert usage.startswith("usage:"), f"{script} --help said {usage[:200]!r}"

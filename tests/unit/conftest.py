"""Fixtures the unit tests share: the tools scripts/install-tools.sh provides."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus' promtool (installed on first use, as `make services` does)."""
    tool = Path.home() / ".cache" / "gpu-health" / "bin" / "promtool"
    if not tool.exists():
        subprocess.run([str(REPO / "scripts" / "install-tools.sh")], check=True)
    return tool

"""Fixtures the unit tests share: the tools scripts/install-tools.sh provides.

A unit test installs nothing: `make test-unit` and `make test` install the tools
first, and a test that finds one missing fails saying how to install it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus' promtool, as scripts/install-tools.sh unpacks it."""
    cache = Path(os.environ.get("GPUHEALTH_CACHE") or Path.home() / ".cache" / "gpu-health")
    tool = cache / "bin" / "promtool"
    assert tool.exists(), f"no promtool at {tool}: run scripts/install-tools.sh (make test-unit does)"
    return tool

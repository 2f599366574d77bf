"""The collector runs on every GPU node: it loads only what it uses (bench/bench_collector_cost.py
measures what that costs)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO


def test_the_collector_loads_no_database_driver() -> None:
    # a fresh interpreter: this test process has imported psycopg for other tests already
    probe = "import sys, services.collector.__main__; print(sorted(m for m in sys.modules if 'psycopg' in m))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    assert loaded == "[]"

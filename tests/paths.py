"""Where the tests find the repository, its tracked files and their recorded data."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def tracked_files() -> list[Path]:
    """Every file git tracks in the checkout (that is there)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in listed.decode().split("\0") if p and (REPO / p).is_file()]

"""Every block marked `<!-- runnable -->` in the README and docs/ runs as written, against an API served over
a scored fleet.

The only rewrites are the addresses a test cannot own: the API's port (the test
serves its own), the venv (the test's own, which `make venv` built the same way)
and `make up`'s token files (the test session's own issuer's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.identities import identities
from tests.paths import REPO

RUNNABLE = re.compile(r"^<!-- runnable -->\n```sh\n(.*?)^```", re.M | re.S)


DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def runnable_blocks() -> list[tuple[str, str]]:
    """(the file, the block) for every marked block, README first."""
    return [(str(d.relative_to(REPO)), block) for d in DOCS for block in RUNNABLE.findall(d.read_text())]


def test_the_docs_mark_their_runnable_blocks() -> None:
    blocks = runnable_blocks()
    assert len(blocks) >= 5
    assert {doc for doc, _ in blocks} >= {"README.md", "docs/services/api.md", "docs/operating.md"}
    assert any("gpuhealth fleet" in b for _, b in blocks)
    assert any("promtool test rules" in b for _, b in blocks)
    assert any("/acknowledge" in b for _, b in blocks)


def test_every_runnable_block_runs_as_written(served_api: str, scored: dict[str, Any]) -> None:
    api = served_api.removeprefix("http://")
    venv_bin = str(Path(sys.executable).parent) + "/"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUHEALTH_URL")}
    env |= {"GPUHEALTH_URL": served_api}
    tokens = f"{identities().directory}/"
    outputs = []
    for doc, block in runnable_blocks():
        script = block.replace("localhost:8000", api).replace("~/.cache/gpu-health/venv/bin/", venv_bin)
        script = script.replace("~/.cache/gpu-health/run/auth/", tokens)
        script = script.replace("$HOME/.cache/gpu-health/run/auth/", tokens)
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert run.returncode == 0, (
            f"{doc}: block failed:\n{block}\n--- stderr:\n{run.stderr}\n--- stdout:\n{run.stdout}"
        )
        assert run.stdout.strip(), block
        outputs.append(run.stdout)
    text = "\n".join(outputs)
    assert '"unhealthy":1' in text.replace(" ", "")  # the fleet summary
    assert '"acknowledged_by":"local-operator"' in text.replace(
        " ", ""
    )  # the acknowledge example: the token's subject
    assert "GPUs 4  healthy 3" in text  # gpuhealth fleet
    assert "volatile_dbe" in text  # gpuhealth gpu, the worst GPU
    assert "SUCCESS" in text  # promtool test rules

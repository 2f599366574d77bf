"""Prints the third-party requirements of the project's two distributions, one a line.

The pipeline (pyproject.toml) and the users' library (gpuhealth/pyproject.toml)
each list their own; the pipeline also names the library, which is this
checkout's code, not a package to fetch. With --dev, the development tools
(the pipeline's `dev` extra) follow. scripts/pyenv.sh and the Dockerfile
install what this prints: the one place the lists are read.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
OWN = HERE / "pyproject.toml", HERE / "gpuhealth" / "pyproject.toml"


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    return re.sub(r"[-_.]+", "-", match[0]).lower() if match else requirement


def requirements(*, dev: bool) -> list[str]:
    projects = [tomllib.loads(path.read_text())["project"] for path in OWN]
    own = {_name(project["name"]) for project in projects}
    wanted: list[str] = []
    for project in projects:
        extras = project.get("optional-dependencies", {})
        lists = [project["dependencies"], *(v for k, v in extras.items() if k != "dev")]
        wanted += [r for listed in lists for r in listed if _name(r) not in own]
    if dev:
        wanted += projects[0]["optional-dependencies"]["dev"]
    return list(dict.fromkeys(wanted))  # each once, in the order first listed


if __name__ == "__main__":
    print("\n".join(requirements(dev="--dev" in sys.argv[1:])))

"""What the project's Dockerfile puts in its image, and what a compose service needs from it.

Read from the Dockerfile's COPY instructions and .dockerignore, without an engine:
a service whose command module, settings file or environment path is not in the
image fails this check before anyone runs `docker compose up` (the scorer
without config/ did: it exited 2 at start).
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import shlex
import typing
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel

from services.api.settings import ApiSettings
from services.collector.__main__ import CollectorSettings
from services.lifecycle.settings import LifecycleSettings
from services.mock_dcgm.settings import MockDcgmSettings
from services.remediator.settings import RemediatorSettings
from services.scorer.__main__ import ScorerSettings
from services.sink.__main__ import SinkSettings
from shared.settings.common import Settings

# Each compose service of the project's image and the settings it reads (the rest read Settings).
SERVICE_SETTINGS: dict[str, type[Settings]] = {
    "mock": MockDcgmSettings, "collector-0": CollectorSettings, "collector-1": CollectorSettings,
    "collector-2": CollectorSettings, "collector-3": CollectorSettings, "collector-gpu": CollectorSettings,
    "collector-nvml": CollectorSettings, "sink": SinkSettings, "scorer": ScorerSettings, "api": ApiSettings,
    "remediator": RemediatorSettings, "lifecycle": LifecycleSettings,
}  # fmt: skip


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(keyword, arguments) of each instruction, continuations joined, heredoc bodies left out."""
    found: list[tuple[str, str]] = []
    lines = iter(dockerfile.splitlines())
    pending = ""
    for raw in lines:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        found.append((keyword.upper(), args.strip()))
        for marker in re.findall(r"<<-?'?\"?(\w+)", args):
            for body in lines:
                if body.strip() == marker:
                    break
    return found


def _ignored(relative: str, patterns: list[str]) -> bool:
    parts = relative.split("/")
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


class ImageFiles(typing.NamedTuple):
    workdir: str
    paths: frozenset[str]

    def holds(self, path: str) -> bool:
        """A file at `path`, or a folder with files under it."""
        return path in self.paths or any(p.startswith(path.rstrip("/") + "/") for p in self.paths)


def image_files(dockerfile: str, context: Path) -> ImageFiles:
    """Absolute paths of the build-context files the last stage copies in, and its WORKDIR."""
    ignore_lines = (context / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in ignore_lines if p.strip() and not p.startswith("#")]
    workdir, paths = "/", set[str]()
    for keyword, args in _instructions(dockerfile):
        if keyword == "FROM":
            workdir, paths = "/", set()
        elif keyword == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / args)
        elif keyword in ("COPY", "ADD"):
            words = shlex.split(args)
            if any(w.startswith("--from") for w in words):
                continue
            *sources, dest = [w for w in words if not w.startswith("--")]
            target = PurePosixPath(workdir) / dest
            for source in sources:
                path = context / source
                if path.is_dir():
                    for f in path.rglob("*"):
                        relative = f.relative_to(context).as_posix()
                        if f.is_file() and not _ignored(relative, patterns):
                            paths.add(str(target / f.relative_to(path).as_posix()))
                elif path.is_file():
                    into_folder = dest.endswith("/") or len(sources) > 1
                    paths.add(str(target / path.name if into_folder else target))
    return ImageFiles(workdir, frozenset(paths))


def _module_paths(module: str, workdir: str) -> list[str]:
    base = f"{workdir}/{module.replace('.', '/')}"
    return [f"{base}/__main__.py", f"{base}.py"]


def _repo_paths_of(module_name: str, repo: Path) -> list[Path]:
    """Module-level Path constants of a module (and its __main__) that point into the repository."""
    found = []
    for name in (module_name, f"{module_name}.__main__"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        found += [v for v in vars(module).values() if isinstance(v, Path) and v.is_relative_to(repo)]
    return found


def _path_settings(settings: type[BaseModel]) -> dict[str, Any]:
    """`GPUHEALTH_<SECTION>__<FIELD>` -> default, for every setting that names a file."""
    found = {}
    for section, field in settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, sub in model.model_fields.items():
            if Path in (sub.annotation, *typing.get_args(sub.annotation)):
                found[f"GPUHEALTH_{section.upper()}__{name.upper()}"] = sub.default
    return found


def app_image_misses(
    service: dict[str, Any], settings: type[BaseModel], files: ImageFiles, repo: Path
) -> list[str]:
    """Image paths a service of the project's image needs that the image does not hold."""
    workdir = PurePosixPath(files.workdir)
    needed: set[str] = set()
    command = " ".join(str(part) for part in service.get("command", []))
    for module in re.findall(r"\b((?:services|shared|evaluation)(?:\.\w+)+)", command):
        candidates = _module_paths(module, files.workdir)
        if not any(files.holds(c) for c in candidates):
            needed.add(candidates[0])
        needed |= {str(workdir / p.relative_to(repo).as_posix()) for p in _repo_paths_of(module, repo)}
    environment = service.get("environment", {})
    for var, default in _path_settings(settings).items():
        value = environment.get(var, default)
        if value is None:
            continue
        path = Path(value)
        if path.is_absolute() and path.parts[1:2] in (("proc",), ("sys",), ("dev",)):
            continue  # the kernel's, in every container
        if path.is_absolute() and path.is_relative_to(repo):
            needed.add(str(workdir / path.relative_to(repo).as_posix()))
        else:
            needed.add(str(workdir / path.as_posix()))  # an absolute path stays itself
    # What a volume mounts is there whatever the image holds (short "src:dst" or resolved form), and
    # what a tmpfs mounts ("dst:options") is written at run time (the API's local issuer's /auth).
    volumes = service.get("volumes", [])
    mounts = [v["target"] if isinstance(v, dict) else str(v).split(":")[1] for v in volumes]
    tmpfs = service.get("tmpfs", [])
    mounts += [str(t).split(":")[0] for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]
    return sorted(
        p for p in needed if not files.holds(p) and not any(p == m or p.startswith(m + "/") for m in mounts)
    )

"""What a module imports, read from its source with `ast` (nothing is imported): for the layout checks."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.paths import REPO

# The project's top-level packages, whose modules the import checks follow.
PROJECT_PACKAGES = ("services", "shared", "gpuhealth", "evaluation", "bench", "tests")


def imported_modules(path: Path) -> list[str]:
    """The absolute module names a file imports (relative imports left out), at any depth in it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def module_name(path: Path) -> str:
    """`shared/contract/models.py` -> `shared.contract.models`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages, by name."""
    return {
        module_name(path): path
        for top in PROJECT_PACKAGES
        for path in sorted((REPO / top).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative levels resolved against the importing file."""
    if node.level == 0:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project modules a file imports, relative imports included; `from a import b` is `a.b`
    when that is a module, else `a`. Imports under `if TYPE_CHECKING:` run at no time and are left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    yield f"{module}.{alias.name}"
                elif module in known:
                    yield module

"""House rules that a linter cannot say: each service is `python -m services.<name>` with a
`main() -> int`, services import `shared`, never each other, and the users' library (gpuhealth)
reaches services only through its bridge module; no C or C++ source is in the tree."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO

SERVICES = sorted(p.name for p in (REPO / "services").iterdir() if (p / "__init__.py").exists())


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("service", SERVICES)
def test_services_never_import_each_other(service: str) -> None:
    for path in (REPO / "services" / service).rglob("*.py"):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "services" and len(parts) > 1:
                assert parts[1] == service, f"{path.relative_to(REPO)} imports {module}"


def test_shared_imports_no_service() -> None:
    for path in (REPO / "shared").rglob("*.py"):
        assert not [m for m in imported_modules(path) if m.split(".")[0] == "services"], path


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_a_main_returning_int(service: str) -> None:
    module = importlib.import_module(f"services.{service}.__main__")
    assert inspect.signature(module.main).return_annotation in ("int", int)


# The users' library (gpuhealth) reaches services only through this module, and only this of theirs:
# the scorer's rules loader.
LIBRARY_BRIDGES = {"gpuhealth/training/thresholds.py": {"services.scorer.rules_config"}}

# What the services and shared may use of the library: its pieces that both need, never the training Andon.
LIBRARY_COMMON = ("gpuhealth.errors", "gpuhealth.gpu")


def test_the_library_reaches_services_only_through_its_bridges() -> None:
    for path in (REPO / "gpuhealth").rglob("*.py"):
        used = {m for m in imported_modules(path) if m.split(".")[0] == "services"}
        allowed = LIBRARY_BRIDGES.get(str(path.relative_to(REPO)), set())
        assert used <= allowed, f"{path.relative_to(REPO)} imports {sorted(used - allowed)}"


def test_services_and_shared_use_only_the_librarys_common_pieces() -> None:
    for path in sorted((REPO / "services").rglob("*.py")) + sorted((REPO / "shared").rglob("*.py")):
        used = [m for m in imported_modules(path) if m.split(".")[0] == "gpuhealth"]
        wrong = [m for m in used if not any(m == c or m.startswith(c + ".") for c in LIBRARY_COMMON)]
        assert not wrong, f"{path.relative_to(REPO)} imports {wrong}"


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "services").rglob("*.py"))
    + sorted((REPO / "shared").rglob("*.py"))
    + sorted((REPO / "gpuhealth").rglob("*.py")),
)
def test_modules_have_a_docstring_and_stay_readable(path: Path) -> None:
    text = path.read_text()
    if path.name != "__init__.py" or text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.relative_to(REPO)} has no docstring"
    assert len(text.splitlines()) <= 450, f"{path.relative_to(REPO)} is too long to read in one sitting"


def test_nothing_outside_tests_imports_the_tests() -> None:
    for top in ("services", "shared", "gpuhealth", "evaluation", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            assert not [m for m in imported_modules(path) if m.split(".")[0] == "tests"], path


def test_the_fakes_stay_out_of_the_services_and_the_library() -> None:
    for top in ("services", "gpuhealth"):
        for path in sorted((REPO / top).rglob("*.py")):
            used = [m for m in imported_modules(path) if m.startswith("shared.fakes")]
            assert not used, f"{path.relative_to(REPO)} imports {used}"
    for path in sorted((REPO / "shared").rglob("*.py")):
        if "fakes" not in path.relative_to(REPO / "shared").parts:
            assert not [m for m in imported_modules(path) if m.startswith("shared.fakes")], path


def test_the_tests_mirror_the_package_tree() -> None:
    """A test module sits under tests/unit or tests/integration at the path of what it tests."""
    roots = {"services", "shared", "gpuhealth", "evaluation", "bench", "deploy", "schema", "bin"}
    for kind in ("unit", "integration"):
        for path in sorted((REPO / "tests" / kind).rglob("test_*.py")):
            parts = path.relative_to(REPO / "tests" / kind).parts
            if len(parts) == 1:  # repository-wide checks (the layout, the README) sit at the top
                continue
            assert parts[0] in roots, f"{path.relative_to(REPO)}: not under a mirrored folder"
            assert (REPO / Path(*parts[:-1])).is_dir(), (
                f"{path.relative_to(REPO)}: {Path(*parts[:-1])} is not in the tree"
            )


C_SOURCES = {".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp"}


def test_no_c_or_cpp_source_is_in_the_tree() -> None:
    """Every line of the project is memory-safe code: a compiled piece, should one ever earn its
    place, is written in a memory-safe language and built by the package build."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = [Path(name) for name in listed.decode().split("\0") if name]
    assert tracked, "git ls-files listed nothing"
    assert [str(p) for p in tracked if p.suffix.lower() in C_SOURCES] == []

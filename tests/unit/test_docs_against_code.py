"""What the docs say about the code, checked against the code: the store's module list, the
contributors' layout against the tree, every `docs/` path a file names, and the operators' scaling
claims against the settings' defaults."""

from __future__ import annotations

import re

import shared.store
from tests.paths import REPO, tracked_files


def test_the_store_docstring_lists_exactly_the_modules_of_the_store() -> None:
    listed = re.findall(r"^- `(\w+)`:", shared.store.__doc__ or "", re.M)
    modules = {p.stem for p in (REPO / "shared" / "store").glob("*.py") if p.stem != "__init__"}
    assert len(listed) == len(set(listed)), "shared/store/__init__.py lists a module twice"
    assert sorted(modules - set(listed)) == [], "modules of shared/store its docstring does not list"
    assert sorted(set(listed) - modules) == [], "shared/store's docstring lists modules that do not exist"


# A path under docs/ as a file names it (not a URL's or another repository's: tests/data quotes those).
DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*\w")


def test_every_docs_path_a_file_names_exists() -> None:
    """A page moved or renamed leaves no file naming its old path. The applied migrations (schema/*.sql)
    are left out: they are checksummed, and one is never edited (0060 names the lifecycle page where it
    was when 0060 was applied, before it moved under docs/services/)."""
    stale = []
    for path in tracked_files():
        relative = path.relative_to(REPO)
        applied_migration = relative.parts[0] == "schema" and path.suffix == ".sql"
        if applied_migration or relative.parts[:2] == ("tests", "data"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        stale += [f"{relative}: {name}" for name in DOCS_PATH.findall(text) if not (REPO / name).exists()]
    assert stale == [], "files name docs that do not exist"

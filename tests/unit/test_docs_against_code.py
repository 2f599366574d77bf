"""What the docs say about the code, checked against the code: the store's module list, the
contributors' layout against the tree, every `docs/` path a file names, and the operators' scaling
claims against the settings' defaults."""

from __future__ import annotations

import re

import shared.store
from tests.paths import REPO


def test_the_store_docstring_lists_exactly_the_modules_of_the_store() -> None:
    listed = re.findall(r"^- `(\w+)`:", shared.store.__doc__ or "", re.M)
    modules = {p.stem for p in (REPO / "shared" / "store").glob("*.py") if p.stem != "__init__"}
    assert len(listed) == len(set(listed)), "shared/store/__init__.py lists a module twice"
    assert sorted(modules - set(listed)) == [], "modules of shared/store its docstring does not list"
    assert sorted(set(listed) - modules) == [], "shared/store's docstring lists modules that do not exist"

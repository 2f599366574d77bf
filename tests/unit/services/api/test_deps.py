"""Handlers get the database, the cache, the settings and the state as dependencies (services/api/deps.py),
never by reading the application's state themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

ROUTES = sorted((REPO / "services" / "api" / "routes").glob("*.py"))


@pytest.mark.parametrize("path", ROUTES, ids=lambda p: p.name)
def test_a_route_module_reads_no_application_state(path: Path) -> None:
    tree = ast.parse(path.read_text())
    reads = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (node.attr == "app" or (node.attr == "state" and ast.unparse(node.value).endswith("app")))
    ]
    assert not reads, f"{path.relative_to(REPO)} reads {reads}: take a dependency from services/api/deps.py"
    imported = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "Request" not in imported, f"{path.relative_to(REPO)} takes the raw Request"


def test_every_route_module_is_checked() -> None:
    assert len(ROUTES) >= 6

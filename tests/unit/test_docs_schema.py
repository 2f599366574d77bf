"""schema/README.md's numbering rule holds for the migrations in schema/: four-digit numbers, each used
once, whose gaps are exactly the ones the README explains (a new migration takes the next number)."""

from __future__ import annotations

import itertools
import re

from shared.plumbing.migrate import discover
from tests.paths import REPO

SCHEMA = REPO / "schema"
NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def numbers() -> list[int]:
    """The migrations' numbers, in the files' order (by name)."""
    found = []
    for path in sorted(SCHEMA.glob("*.sql")):
        match = NAME.match(path.name)
        assert match, f"{path.name}: a migration is named NNNN_lower_snake.sql (schema/README.md)"
        found.append(int(match[1]))
    return found


def explained_gaps() -> set[int]:
    """Every number the README's table of gaps names, as single numbers and ranges (0010–0011)."""
    text = (SCHEMA / "README.md").read_text()
    table = text[text.index("| gap | what happened |") :].split("\n\n")[0]
    gaps: set[int] = set()
    for cell in re.findall(r"^\| ([\d–, ]+) \|", table, re.M):
        for first, last in re.findall(r"(\d{4})(?:–(\d{4}))?", cell):
            gaps.update(range(int(first), int(last or first) + 1))
    return gaps


def test_each_number_is_four_digits_and_used_once_in_order() -> None:
    found = numbers()
    assert found, "schema/ holds no migration"
    assert all(a < b for a, b in itertools.pairwise(found)), "two migrations share a number"
    assert [m.version for m in discover(SCHEMA)] == found  # the runner's order is the files' order


def test_the_gaps_are_exactly_those_the_readme_explains() -> None:
    """A migration that skips ahead opens a gap the README does not explain; one that fills a gap leaves
    the README explaining a gap that is gone: both fail here."""
    found = numbers()
    gaps = set(range(1, max(found) + 1)) - set(found)
    assert sorted(gaps - explained_gaps()) == [], (
        "numbers skipped that schema/README.md does not explain: a new migration takes the next number"
    )
    assert sorted(explained_gaps() - gaps) == [], (
        "schema/README.md explains gaps that are not gaps: a landed migration's number is never reused"
    )

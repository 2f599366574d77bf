"""The docs hold together: a README a newcomer reads in minutes, links that land, no file that points
outside the repository, and the operators' topic table naming every topic the registry has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.contract.topic_registry import TopicSettings
from tests.paths import REPO, tracked_files

DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "gpuhealth" / "README.md",
        REPO / "schema" / "README.md",
        *(REPO / "docs").rglob("*.md"),
    ]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Names of what lies outside the repository, written so that this file does not name them itself.
OUTSIDE = ("../" + "shared", "DESIGN" + ".md")


def test_nothing_refers_to_files_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(REPO)}: {name}" for name in OUTSIDE if name in text]
    assert not found, "a file refers to what the repository does not contain (say what it means instead)"


def test_the_readme_is_read_in_minutes() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 300


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # a `#` in a code block is no heading
    found = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_lands(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        landing = (doc.parent / file_part).resolve() if file_part else doc
        if not landing.exists():
            broken.append(f"{target}: no such file")
        elif anchor and landing.suffix == ".md" and anchor not in anchors(landing):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_every_doc_is_reached_from_the_readme() -> None:
    reached, todo = set(), [REPO / "README.md"]
    while todo:
        doc = todo.pop()
        if doc in reached:
            continue
        reached.add(doc)
        for target in links(doc):
            landing = (doc.parent / target.partition("#")[0]).resolve()
            if landing.is_dir():
                todo += sorted(landing.glob("*.md"))
            elif landing.suffix == ".md" and landing.exists():
                todo.append(landing)
    assert set(DOCS) - reached == set()


def test_the_operators_topic_table_lists_every_topic_of_the_registry_with_its_key() -> None:
    text = (REPO / "docs" / "operating.md").read_text()
    table = text[text.index("| topic | key | what |") :].split("\n\n")[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", table, re.M))
    registry = {entry.default: entry.topic.key for entry in TopicSettings.registry()}
    assert set(rows) == set(registry), "docs/operating.md's topic table (## Kafka) and the registry differ"
    # each row says the key as its registry entry does (Key.says)
    wrong = {name: rows[name] for name, key in registry.items() if not rows[name].startswith(key.says)}
    assert not wrong, f"keys the registry does not give: {wrong}"


def test_the_contributors_layout_names_every_top_level_folder_and_every_service() -> None:
    text = (REPO / "docs" / "contributing.md").read_text()
    layout = text[text.index("## Layout") :].split("```")[1]
    folders = {p.relative_to(REPO).parts[0] for p in tracked_files() if len(p.relative_to(REPO).parts) > 1}
    unnamed = [f for f in sorted(folders) if not re.search(rf"^{re.escape(f)}/", layout, re.M)]
    assert not unnamed, f"docs/contributing.md's Layout does not name {unnamed}"
    services = [p.parent.name for p in (REPO / "services").glob("*/__main__.py")]
    line = next(li for li in layout.splitlines() if li.startswith("services/"))
    assert [s for s in services if s not in line] == [], "a service missing from the Layout's services/ line"

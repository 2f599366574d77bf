"""What the docs say about the code, checked against the code: the store's module list, the
contributors' layout against the tree, every `docs/` path a file names, and the operators' scaling
claims against the settings' defaults."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import shared.store
from shared.contract.topic_registry import TopicSettings
from shared.settings.reference import TREES, load_tree
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


def layout_entries() -> dict[str, str]:
    """docs/contributing.md's Layout: each folder it describes (`shared/contract`, ...) -> its text; the
    files it names at the top under ``""``."""
    text = (REPO / "docs" / "contributing.md").read_text()
    lines = text[text.index("## Layout") :].split("```")[1].strip("\n").splitlines()
    entries, top, current = {"": lines[0]}, "", ""
    for line in lines[1:]:
        if folder := re.match(r"^([.\w-]+)/\s", line):
            top = current = folder[1]
        elif package := re.match(r"^  ([\w-]+)/\s", line):
            current = f"{top}/{package[1]}"
        entries[current] = entries.get(current, "") + line + "\n"
    return entries


FILE_NAMED = re.compile(r"(?<![\w./<*-])([\w./-]*\w\.(?:py|sh|toml|csv|json|md|yml|yaml))\b")
FOLDER_NAMED = re.compile(r"(?<![\w./<-])([\w-]+)/(?=[\s,:)]|$)", re.M)


def test_the_layout_names_every_shared_package_and_no_other() -> None:
    named = {folder.partition("/")[2] for folder in layout_entries() if folder.startswith("shared/")}
    packages = {p.parent.name for p in (REPO / "shared").glob("*/__init__.py")}
    assert sorted(packages - named) == [], "shared/ packages docs/contributing.md's Layout does not name"
    assert sorted(named - packages) == [], "the Layout names shared/ packages that do not exist"


def test_everything_the_layout_names_exists() -> None:
    """Its folders, the files and sub-folders each one's text names, and the services it lists."""
    entries = layout_entries()
    missing = [name for name in entries.pop("").split() if not (REPO / name).is_file()]
    for folder, text in entries.items():
        base = REPO / folder
        if not base.is_dir():
            missing.append(f"{folder}/")
            continue
        for name in FILE_NAMED.findall(text):
            if not ((REPO / name).exists() or (base / name).exists() or any(base.rglob(name))):
                missing.append(f"{folder}: {name}")
        for name in FOLDER_NAMED.findall(re.sub(r"^\s*[.\w-]+/", "", text)):
            if not any(p.is_dir() for p in base.rglob(name)):
                missing.append(f"{folder}: {name}/")
    services = [s.strip(",") for s in entries["services"].split(":")[0].split()[1:]]
    missing += [f"services: {s}" for s in services if not (REPO / "services" / s / "__main__.py").exists()]
    assert missing == [], "docs/contributing.md's Layout names what is not in the tree"


def test_the_layout_names_every_page_of_docs() -> None:
    named = set(FILE_NAMED.findall(layout_entries()["docs"]))
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert sorted(pages - named) == [], "pages of docs/ that docs/contributing.md's Layout does not name"
    services = sorted(p.stem for p in (REPO / "docs" / "services").glob("*.md"))
    assert [s for s in services if not (REPO / "services" / s).is_dir()] == [], (
        "a page in docs/services/ that is no service's (the Layout says: a page per service)"
    )


def settings_default(service: str, section: str) -> Any:
    """A service's settings section with every default, found through the settings reference's TREES."""
    path = next(path for who, path in TREES if f"services.{service}`" in who)
    return load_tree(path).model_fields[section].get_default(call_default_factory=True)


def partitions_of(topic: str) -> int:
    entry = next(e for e in TopicSettings.registry() if e.default == topic)
    return entry.topic.partitions or TopicSettings.model_fields["partitions"].default


def seconds(value: float) -> str:
    return f"{value:g} s"


def test_the_operators_scaling_claims_are_the_settings_defaults() -> None:
    """docs/operating.md's "Scaling out": the sink's and the scorers' groups, how many of each are
    useful (a partition each), how `make up` runs them, and the scorers' hand-over and chunk."""
    text = (REPO / "docs" / "operating.md").read_text()
    section = " ".join(text[text.index("## Scaling out and moving a deployment") :].split("\n## ")[0].split())
    sink, scorer = settings_default("sink", "sink"), settings_default("scorer", "scorer")
    stack = tomllib.loads((REPO / "deploy" / "local-stack.toml").read_text())["process"]
    scorers = re.search(r'"\$\{GPUHEALTH_SCORERS:=(\d+)\}"', (REPO / "scripts" / "env.sh").read_text())
    assert scorers, "scripts/env.sh gives GPUHEALTH_SCORERS no default"
    assert stack["scorer"]["replicas"] == "${GPUHEALTH_SCORERS}", (
        "make up's scorers are not GPUHEALTH_SCORERS"
    )
    assert "GPUHEALTH_SCORERS=$(SCORERS)" in (REPO / "Makefile").read_text()
    assert "replicas" not in stack["sink"], "the doc says make up runs one sink"
    assert scorer.events, "the doc says a scorer is in a group (its fast path on) unless told otherwise"
    claims = [
        f"`GPUHEALTH_SINK__GROUP_ID` (`{sink.group_id}` by default;",
        "`make up` runs one)",
        f"Up to one sink per partition is useful ({partitions_of('gpu-metrics-raw')} by default,"
        " `GPUHEALTH_TOPICS__PARTITIONS`)",
        f"`GPUHEALTH_SINK__LANES` ({sink.lanes}) lanes",
        f"`GPUHEALTH_SCORER__GROUP` (`{scorer.group}` by default) share the fleet by `gpu-events`'",
        f"so up to {partitions_of('gpu-events')} are useful",
        f"`make up SCORERS=3` (`GPUHEALTH_SCORERS`, {scorers[1]} by default)",
        f"`GPUHEALTH_SCORER__SESSION_TIMEOUT_S` ({seconds(scorer.session_timeout_s)})",
        "`GPUHEALTH_SCORER__EVENTS=false` (or a fixed as-of time) is in no group",
        f"`GPUHEALTH_SCORER__CYCLE_CHUNK` ({scorer.cycle_chunk}) GPUs to a transaction",
    ]
    assert [c for c in claims if c not in section] == [], (
        "docs/operating.md's scaling claims and the code differ"
    )
    assert "one process" not in section, "the scorer scales out by partitions"


# Named on purpose though absent: operating says Kafka's own ACL tool is not wrapped under bin/.
NAMED_ABSENT = {"bin/kafka-acls"}


def test_every_repository_path_the_docs_name_exists() -> None:
    """A path in backticks that starts at a top-level folder (`services/scorer/cycle.py`, `deploy/`)
    names something in the tree: a file moved or renamed by a refactor fails here until its docs follow."""
    tops = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".git")}
    docs = [REPO / "README.md", REPO / "gpuhealth" / "README.md", REPO / "schema" / "README.md"]
    missing = []
    for doc in [*docs, *sorted((REPO / "docs").rglob("*.md"))]:
        for name in re.findall(r"`([.\w-]+/[\w./-]*)`", doc.read_text()):
            a_path = name.split("/")[0] in tops and "NNNN" not in name and name not in NAMED_ABSENT
            if a_path and not (REPO / name).exists():
                missing.append(f"{doc.relative_to(REPO)}: {name}")
    assert missing == [], "paths the docs name that are not in the tree"

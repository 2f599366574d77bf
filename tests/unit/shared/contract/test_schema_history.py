"""A committed JSON Schema never changes incompatibly without a new version in its file name.

Each ``schema/json/*.vN.schema.json`` is compared along the history of the branch (its first parents,
so a merged branch counts as the merge) and then with the working tree: every step must be BACKWARD
compatible (shared/contract/schema_compat.py), so a reader with the new schema reads everything
written under the old. A step that is not fails, unless it is one of the reviewed, shipped steps below:
those are recorded here, with why no record on the wire was refused, instead of rewriting history.
An incompatible change needs a new file (``.v2``) and a topic entry that carries both.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from shared.contract.schema_compat import incompatibilities

ROOT = Path(__file__).resolve().parents[4]
SCHEMAS = "schema/json"
# The model's field had a default of 1 and every producer sends defaults (model_dump): every record
# already carried schema_version when the schema began to require it.
_VERSION = (
    "schema_version became required; the model's default 1 was always serialised, so no record on the "
    "wire lacked it"
)


@dataclass(frozen=True)
class Shipped:
    """A reviewed incompatible step already on main: the file, the commit, what it found, and why."""

    schema: str
    commit: str  # the first-parent commit that made the step (a merge names its branch's commits)
    finding: str  # a regex every finding of that step matches
    why: str


SHIPPED = (
    Shipped(
        "gpu-sample.v1.schema.json",
        "8b41eca",
        r"/anyOf/0: no alternative of the new schema reads it",
        "DCGM's int64 'blank' sentinels (2^63-1 and the 15 below it) refused as counters: they were "
        "never readings, and the sink stored them as real values",
    ),
    Shipped(
        "gpu-sample.v1.schema.json",
        "0ae0787",  # merges 2347629, the commit issue 43 names
        r"newly required \['schema_version'\]",
        _VERSION,
    ),
    Shipped(
        "gpu-event.v1.schema.json",
        "0ae0787",  # merges 2347629
        r"newly required \['schema_version'\]|maxProperties 32 -> 16|allOf of 0 parts -> 8",
        _VERSION + "; details typed per event kind, at most 16 (no kind's details had more)",
    ),
    *(
        Shipped(name, "ad05efc", r"newly required \['schema_version'\]", _VERSION)
        for name in (
            "gpu-alert-training.v1.schema.json",
            "gpu-system.v1.schema.json",
            "gpu-verification.v1.schema.json",
        )
    ),
    *(
        Shipped(
            name,
            "9157a44",
            r"/(command_line|executable|error)/anyOf/0: no alternative",
            "free text with a NUL refused: PostgreSQL cannot store it, so the sink already failed on it",
        )
        for name in ("gpu-processes.v1.schema.json", "llm-session.v1.schema.json")
    ),
)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _versions(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The file at each first-parent commit that changed it, oldest first, then the working tree."""
    path = f"{SCHEMAS}/{name}"
    commits = _git("log", "--first-parent", "--format=%H", "--reverse", "--", path).split()
    versions = []
    for commit in commits:
        try:
            versions.append((commit, json.loads(_git("show", f"{commit}:{path}"))))
        except subprocess.CalledProcessError:  # removed at that commit: a later file starts afresh
            versions = []
    return [*versions, ("working tree", json.loads((ROOT / path).read_text()))]


def _steps(name: str) -> list[tuple[str, list[str]]]:
    """Each incompatible step of the file's history: the commit and what it found."""
    versions = _versions(name)
    steps = []
    for (_, old), (commit, new) in pairwise(versions):
        if found := incompatibilities(old, new):
            steps.append((commit, found))
    return steps


def _unreviewed(name: str, commit: str, found: list[str]) -> list[str]:
    shipped = [s for s in SHIPPED if s.schema == name and commit.startswith(s.commit)]
    return [f for f in found if not any(re.search(s.finding, f) for s in shipped)]


SCHEMA_FILES = sorted(p.name for p in (ROOT / SCHEMAS).glob("*.schema.json"))


def test_schema_files_are_versioned() -> None:
    assert SCHEMA_FILES
    for name in SCHEMA_FILES:
        assert re.fullmatch(r"[a-z0-9-]+\.v[1-9][0-9]*\.schema\.json", name), name


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_schema_changes_are_backward_compatible(name: str) -> None:
    for commit, found in _steps(name):
        assert not _unreviewed(name, commit, found), (
            f"{name} changed incompatibly at {commit[:12]} without a new version: "
            f"{_unreviewed(name, commit, found)}"
        )


def test_every_shipped_exception_is_still_needed() -> None:
    for shipped in SHIPPED:
        steps = dict(_steps(shipped.schema))
        matched = [c for c in steps if c.startswith(shipped.commit)]
        assert matched, f"{shipped.schema} at {shipped.commit}: no incompatible step there any more"
        assert any(re.search(shipped.finding, f) for f in steps[matched[0]])


def test_the_check_sees_schema_version_made_required_in_gpu_sample() -> None:
    """Issue 43's case: 2347629 required schema_version in gpu-sample.v1 without a new version."""
    path = f"{SCHEMAS}/gpu-sample.v1.schema.json"
    before = json.loads(_git("show", f"2347629^:{path}"))
    after = json.loads(_git("show", f"2347629:{path}"))
    assert incompatibilities(before, after) == ["#: newly required ['schema_version']"]
    assert incompatibilities(after, before) == []  # dropping the requirement again reads both


def test_an_uncommitted_incompatible_change_is_seen() -> None:
    """What a commit of the working tree would do: require every optional field of gpu-sample.v1."""
    current = json.loads((ROOT / SCHEMAS / "gpu-sample.v1.schema.json").read_text())
    narrowed = json.loads(json.dumps(current))
    narrowed["required"] = sorted({*narrowed.get("required", ()), *narrowed["properties"]})
    optional = set(current["properties"]) - set(current.get("required", ()))
    assert optional, "gpu-sample.v1 has optional fields to require"
    found = incompatibilities(current, narrowed)
    assert found == [f"#: newly required {sorted(optional)}"]

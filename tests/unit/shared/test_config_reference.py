"""The configuration reference: every setting of every tree, described, secrets masked, and never stale."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import SecretStr

from shared.settings import reference as config_reference
from shared.settings.common import Section
from shared.settings.reference import DOC, MASK, NAMES_MODULE, REPO, TREES, blocks, main, outputs, rows


def settings_classes_in_the_code() -> set[str]:
    """`module:Class` of every class that subclasses Settings, found in the source (no import)."""
    found = set()
    for top in ("shared", "services", "gpuhealth"):
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id.endswith("Settings") and b.id != "BaseSettings"
                    for b in node.bases
                ):
                    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
                    found.add(f"{module}:{node.name}")
    return found


def test_the_reference_covers_every_settings_tree() -> None:
    trees = {path for _, path in TREES}
    in_code = {c for c in settings_classes_in_the_code() if "Settings" in c.rsplit(":", 1)[1]}
    assert in_code - trees == set(), "a Settings subclass the reference does not list: add it to TREES"
    assert {p for p in trees if p != "shared.settings.common:Settings"} <= in_code


def test_the_committed_files_are_what_the_models_say() -> None:
    for path, text in outputs().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run `make docs`"


def test_check_mode_says_what_is_stale_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("# an old reference\n")
    monkeypatch.setattr(config_reference, "DOC", stale)
    monkeypatch.setattr(config_reference, "NAMES_MODULE", tmp_path / "config_names.py")
    assert main(["--check"]) == 1
    assert stale.read_text() == "# an old reference\n"
    assert f"{stale} is stale: run `make docs`" in capsys.readouterr().err
    assert main([]) == 0
    assert main(["--check"]) == 0
    assert stale.read_text() == DOC.read_text()


def test_every_setting_is_described_once() -> None:
    rows = [r for b in blocks() for r in b.rows]
    assert len(rows) > 100
    assert len({r.variable for r in rows}) == len(rows)
    assert not [r.variable for r in rows if len(r.description) < 10], "a setting without a docstring"
    doc = DOC.read_text()
    assert all(f"| `{r.variable}` |" in doc for r in rows)


class Demo(Section):
    """A section with a secret default."""

    token: SecretStr = SecretStr("hunter2-default")
    """A token."""
    maybe: SecretStr | None = None
    """Another."""


def test_secrets_are_masked() -> None:
    token, maybe = rows(Demo, "GPUHEALTH_DEMO__")
    assert (token.type, token.default, maybe.default) == ("secret string", f"`{MASK}`", "unset")
    secret_rows = [r for b in blocks() for r in b.rows if r.type.startswith("secret")]
    assert len(secret_rows) >= 5
    assert all(r.default in (f"`{MASK}`", "unset") for r in secret_rows)


def test_defaults_do_not_depend_on_the_machine() -> None:
    text = DOC.read_text() + NAMES_MODULE.read_text()
    assert str(REPO) not in text
    assert "/root" not in text
    assert "/home/" not in text

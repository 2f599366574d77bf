"""GPUHEALTH_* variables nothing reads are named at start, each with the closest name that is read."""

from __future__ import annotations

import difflib
import io
import json
import logging
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.plumbing.logging import setup_logging
from shared.settings import names as config_names
from shared.settings.common import Settings, load_settings
from shared.settings.env import (
    COMPARED_CHARS,
    OTHER_VARIABLES,
    accepted_names,
    known_names,
    unknown_variables,
    warn_unknown_variables,
)
from shared.settings.reference import TREES, load_tree
from tests.paths import REPO

EXACT, OPEN = known_names(*(load_tree(path) for _, path in TREES))
KNOWN = sorted(EXACT)
NAME_CHARS = st.characters(codec="utf-8", exclude_characters="\x00=")


def ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@given(st.sampled_from(KNOWN), st.data())
def test_every_name_a_setting_or_a_script_reads_passes_in_any_case(name: str, data: st.DataObject) -> None:
    flips = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    mixed = "".join(c.lower() if flip else c for c, flip in zip(name, flips, strict=True))
    assert unknown_variables([mixed], EXACT, OPEN) == {}


@given(st.text(NAME_CHARS, max_size=60))
def test_a_mapping_setting_takes_any_key(key: str) -> None:
    assert unknown_variables(["GPUHEALTH_KAFKA__EXTRA__" + (key or "x")], EXACT, OPEN) == {}


@given(st.text(NAME_CHARS, max_size=80))
def test_names_without_the_prefix_are_never_judged(name: str) -> None:
    if not name.upper().startswith("GPUHEALTH_"):
        assert unknown_variables([name], EXACT, OPEN) == {}


@settings(deadline=None)  # a long name is compared with every known one, on a shared machine
@given(st.text(NAME_CHARS, max_size=300))
def test_an_unknown_name_gets_the_most_similar_known_one(tail: str) -> None:
    name = "GPUHEALTH_" + tail
    unknown = unknown_variables([name], EXACT, OPEN)
    if name.upper() in EXACT or any(name.upper().startswith(p) and len(name) > len(p) for p in OPEN):
        assert unknown == {}
        return
    assert list(unknown) == [name]
    suggested = unknown[name]
    assert suggested in EXACT | OPEN
    compared = name.upper()[:COMPARED_CHARS]
    assert ratio(suggested, compared) == max(ratio(k, compared) for k in EXACT | OPEN)


@given(st.sampled_from(KNOWN), st.data())
def test_a_misspelling_is_answered_with_a_name_at_least_as_close_as_the_intended_one(
    name: str, data: st.DataObject
) -> None:
    at = data.draw(st.integers(len("GPUHEALTH_"), len(name) - 1))
    edit = data.draw(st.sampled_from(["drop", "swap", "replace"]))
    if edit == "drop":
        typo = name[:at] + name[at + 1 :]
    elif edit == "swap" and at + 1 < len(name):
        typo = name[:at] + name[at + 1] + name[at] + name[at + 2 :]
    else:
        typo = name[:at] + data.draw(st.sampled_from("ABCXYZ_0")) + name[at + 1 :]
    unknown = unknown_variables([typo], EXACT, OPEN)
    if typo in EXACT or any(typo.startswith(p) and len(typo) > len(p) for p in OPEN):
        return
    assert ratio(unknown[typo], typo) >= ratio(name, typo)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("GPUHEALTH_SINK__LANSE", "GPUHEALTH_SINK__LANES"),
        ("GPUHEALTH_KAFKA_BOOTSTRAP_SERVERS", "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS"),
        ("GPUHEALTH_COLLECTOR__DCGM_URL", "GPUHEALTH_COLLECTOR__DCGM_URLS"),
        ("gpuhealth_db__passwd", "GPUHEALTH_DB__PASSWORD"),
        ("GPUHEALTH_API_PORTT", "GPUHEALTH_API_PORT"),
    ],
)
def test_common_misspellings_name_what_was_meant(typo: str, meant: str) -> None:
    assert unknown_variables([typo], EXACT, OPEN) == {typo: meant}


def test_what_pydantic_ignores_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The alias is what is read (GPUHEALTH_LOG__JSON), not the field's name: the check says the same."""
    monkeypatch.setenv("GPUHEALTH_LOG__JSON_FORMAT", "false")
    assert load_settings(Settings).log.json_format is True
    assert unknown_variables(["GPUHEALTH_LOG__JSON_FORMAT"], EXACT, OPEN) == {
        "GPUHEALTH_LOG__JSON_FORMAT": "GPUHEALTH_LOG__JSON"
    }
    exact, _ = accepted_names(Settings)
    assert {"GPUHEALTH_LOG", "GPUHEALTH_LOG__JSON", "GPUHEALTH_KAFKA__EXTRA"} <= exact


@settings(deadline=None)
@given(st.dictionaries(st.text(NAME_CHARS, max_size=400), st.text(NAME_CHARS, max_size=20), max_size=8))
def test_hostile_names_give_one_printable_warning(environ: dict[str, str]) -> None:
    environ = {"GPUHEALTH_" + k: v for k, v in environ.items()}
    environ |= {"GPUHEALTH_SINK__LANSE": "4", "PATH": "/bin"}
    stream = io.StringIO()
    setup_logging("INFO", service="test", stream=stream)
    try:
        unknown = warn_unknown_variables(environ, Settings)
    finally:
        logging.getLogger().handlers.clear()
    lines = stream.getvalue().rstrip("\n").split("\n")  # JSON lines: only \n ends one
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["level"] == "warning"
    assert record["unknown_variables"] == unknown
    assert record["msg"].isascii()
    assert "'GPUHEALTH_SINK__LANSE' (closest: GPUHEALTH_SINK__LANES)" in record["msg"]


def test_a_clean_environment_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert warn_unknown_variables({"GPUHEALTH_DB__PORT": "5432", "HOME": "/root"}, Settings) == {}
    assert not caplog.records


def test_a_service_warns_at_start() -> None:
    """The real start-up path: a service's start_service logs the warning (the mock has no other needs)."""
    script = (
        "import sys; from shared.plumbing.service import start_service;"
        "from services.mock_ollama.settings import MockOllamaSettings;"
        "sys.exit(0 if start_service(MockOllamaSettings, 'probe') else 3)"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "GPUHEALTH_MOCK_OLLAMA__TIME_SCLAE": "0"}
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "GPUHEALTH_MOCK_OLLAMA__TIME_SCLAE' (closest: GPUHEALTH_MOCK_OLLAMA__TIME_SCALE)" in run.stderr


def test_every_variable_the_repository_mentions_is_read_by_something() -> None:
    """Docs, scripts, compose and code name only variables that exist (or a prefix: `GPUHEALTH_SINK__`)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    wrong: dict[str, list[str]] = {}
    for path in files.decode().split("\0"):
        skipped = path.startswith("tests/") or path == "shared/settings/env.py"  # they misspell on purpose
        if not path or skipped or not (REPO / path).is_file():
            continue
        try:
            text = (REPO / path).read_text()
        except UnicodeDecodeError:
            continue
        for name in set(re.findall(r"GPUHEALTH_[A-Z0-9_]*[A-Z0-9]_*", text)):
            if name in EXACT or any(name.startswith(p) for p in OPEN):
                continue
            if name.endswith("_") and any(k.startswith(name) for k in EXACT):
                continue  # a prefix: "every GPUHEALTH_SINK__* variable"
            wrong.setdefault(name, []).append(path)
    assert not wrong, f"variables nothing reads: {wrong}"


def test_the_other_variables_are_named_once_and_never_shadow_a_setting() -> None:
    names = [v.name for v in OTHER_VARIABLES]
    assert len(names) == len(set(names))
    assert not set(names) & config_names.NAMES
    assert not [n for n in names if "__" in n]  # `__` is the settings' nesting

"""The API judges a GPU missing by the scorer's own rule: one threshold, read from one file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.api.settings import RULES_FILE, ApiSection, missing_after_s
from services.scorer.rules_config import DEFAULT_RULES, load_rules
from shared.plumbing.errors import ConfigError


def test_the_api_reads_the_rules_the_scorer_judges_by() -> None:
    assert ApiSection().rules_file == RULES_FILE == DEFAULT_RULES
    assert missing_after_s(ApiSection().rules_file) == load_rules().availability.missing_after_s


def test_a_rules_file_without_the_threshold_is_refused(tmp_path: Path) -> None:
    for text in (
        "",
        "[availability]\n",
        "[availability]\nmissing_after_s = 0\n",
        "[availability]\nmissing_after_s = '60'\n",
        "not toml [",
    ):
        rules = tmp_path / "rules.toml"
        rules.write_text(text)
        with pytest.raises(ConfigError):
            missing_after_s(rules)
    with pytest.raises(ConfigError):
        missing_after_s(tmp_path / "absent.toml")


def test_an_unusable_rules_file_is_refused_when_the_settings_load(tmp_path: Path) -> None:
    """So `python -m services.api` exits 2 with the reason, instead of a traceback at start."""
    rules = tmp_path / "rules.toml"
    rules.write_text("[availability]\n")
    for bad in (rules, tmp_path / "absent.toml", tmp_path):
        with pytest.raises(ValidationError, match="missing_after_s"):
            ApiSection(rules_file=bad)

"""The Andon keys of the health rules file: the library's copy is the scorer's file, with the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.andon_rules import DEFAULT_RULES, AndonRules, load_andon_rules
from gpuhealth.errors import ConfigError
from services.scorer.rules_config import load_rules
from shared.settings.common import HEALTH_RULES_FILE


def test_the_library_carries_the_scorers_own_file() -> None:
    assert DEFAULT_RULES.read_bytes() == HEALTH_RULES_FILE.read_bytes()
    andon, scorer = load_andon_rules(), load_rules(HEALTH_RULES_FILE)
    assert isinstance(scorer, AndonRules)  # the scorer's model is built on the Andon sections
    for section in ("thermal", "power", "idle"):
        assert getattr(andon, section) == getattr(scorer, section)
    assert andon.memory.fb_used_ratio_alert == scorer.memory.fb_used_ratio_alert


def test_the_scorers_sections_are_left_to_the_scorer_but_a_typo_in_an_andon_section_is_refused(
    tmp_path: Path,
) -> None:
    andon_only = tmp_path / "andon.toml"
    andon_only.write_text(
        "[thermal]\ndefault_slowdown_c = 87\nwarn_margin_c = 5\n"
        "[memory]\nfb_used_ratio_alert = 0.9\nsbe_per_hour_warn = 100\n"
        "[power]\nat_limit_ratio_alert = 0.98\n[idle]\nutil_pct_below = 1\nfor_s = 600\n"
        "[xid.13]\nname = 'the scorer reads this'\n"
    )
    assert load_andon_rules(andon_only).memory.fb_used_ratio_alert == 0.9
    typo = tmp_path / "typo.toml"
    typo.write_text(andon_only.read_text().replace("warn_margin_c", "warn_margn_c"))
    with pytest.raises(ConfigError, match="warn_margn_c"):
        load_andon_rules(typo)
    with pytest.raises(ConfigError, match="warn_margn_c"):
        load_rules(typo)


def test_a_missing_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.toml"):
        load_andon_rules(tmp_path / "nowhere.toml")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400).map(str.encode) | st.binary(max_size=400))
def test_any_bytes_are_rules_or_a_config_error(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("rules") / "rules.toml"
    path.write_bytes(raw)
    try:
        rules = load_andon_rules(path)
    except ConfigError:
        return
    assert 0 < rules.memory.fb_used_ratio_alert <= 1

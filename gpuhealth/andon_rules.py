"""The Andon part of the health rules file: the keys a training job's alerts share with the scorer's.

config/health-rules.toml is one reviewed file for the scorer and for the
training library. The library reads only the keys its Andon alerts use
(thermal, memory pressure, power limit, idle) and leaves the rest, the
scorer's, to the scorer. The scorer's rules model (services/scorer/rules_config.py)
is built from these sections, so both read the same keys with the same checks.

The library carries the file with it (`health-rules.toml` beside this module,
a link to config/health-rules.toml in the repository), so a job that installed
only the library has the reviewed thresholds too.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuhealth.errors import ConfigError

DEFAULT_RULES = Path(__file__).resolve().with_name("health-rules.toml")

M = TypeVar("M", bound=BaseModel)


class RulesSection(BaseModel):
    """A section of the rules file: its keys are all known, and read once."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Thermal(RulesSection):
    default_slowdown_c: float
    warn_margin_c: float = Field(ge=0)


class Power(RulesSection):
    at_limit_ratio_alert: float = Field(gt=0)


class Idle(RulesSection):
    util_pct_below: float = Field(ge=0)
    for_s: int = Field(gt=0)


class AndonMemory(RulesSection):
    """The memory section's Andon key; the section's other keys are the scorer's."""

    model_config = ConfigDict(extra="ignore")

    fb_used_ratio_alert: float = Field(gt=0, le=1)


class AndonRules(RulesSection):
    """The sections the Andon alerts read; the file's other sections are the scorer's."""

    model_config = ConfigDict(extra="ignore")

    thermal: Thermal
    memory: AndonMemory
    power: Power
    idle: Idle


def read_rules_toml(path: Path) -> dict[str, Any]:
    """A rules file's TOML; ConfigError names the file when it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"health rules {path}: {e}") from e


def validated_rules(model: type[M], raw: dict[str, Any], path: Path) -> M:
    """`raw` as `model`; ConfigError names the file and what is wrong in it."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"health rules {path}: {e}") from e


def load_andon_rules(path: Path = DEFAULT_RULES) -> AndonRules:
    """The Andon keys of a rules file (the library's own copy of config/health-rules.toml by default)."""
    return validated_rules(AndonRules, read_rules_toml(path), path)

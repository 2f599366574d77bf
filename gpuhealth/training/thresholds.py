"""Andon thresholds for a training job, read from config/health-rules.toml, the scorer's own file.

The scorer's Andon alerts and a job's alerts answer to the same reviewed file,
read by the same section models (gpuhealth.andon_rules, which the scorer's
loader builds on). Without a path, the file is the copy the library carries.
Every value can be overridden in code, e.g. ``AndonThresholds.from_rules(thermal_c=80)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from gpuhealth.andon_rules import DEFAULT_RULES, AndonRules, load_andon_rules
from gpuhealth.errors import ConfigError


@dataclass(frozen=True, slots=True)
class AndonThresholds:
    """When each alert fires; defaults and meanings as in config/health-rules.toml."""

    # thermal: the GPU's own slowdown temperature (default_slowdown_c when it reports none)
    # minus the margin, unless `thermal_c` fixes an absolute limit for every GPU.
    default_slowdown_c: float = 87.0
    thermal_margin_c: float = 5.0
    thermal_c: float | None = None
    # memory pressure: framebuffer used / total at or above this.
    memory_used_ratio: float = 0.95
    # power limit: draw at or above this fraction of the enforced power limit.
    power_limit_ratio: float = 0.98
    # idle / hang: utilisation below this percentage for this long.
    idle_util_pct: float = 1.0
    idle_for_s: float = 600.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"andon threshold {f.name} must be a finite number, not {value!r}")
        checks = {
            "default_slowdown_c": -60 <= self.default_slowdown_c <= 250,
            "thermal_margin_c": 0 <= self.thermal_margin_c <= 100,
            "thermal_c": self.thermal_c is None or -60 <= self.thermal_c <= 250,
            "memory_used_ratio": 0 < self.memory_used_ratio <= 1,
            "power_limit_ratio": 0 < self.power_limit_ratio <= 2,
            "idle_util_pct": 0 <= self.idle_util_pct <= 100,
            "idle_for_s": self.idle_for_s >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(
                f"andon thresholds out of range: {', '.join(f'{b}={getattr(self, b)}' for b in bad)}"
            )

    @classmethod
    def from_rules(cls, path: Path | str | None = None, **overrides: Any) -> AndonThresholds:
        """The rules file's values, then the overrides given in code."""
        rules = load_andon_rules(Path(path) if path is not None else DEFAULT_RULES)
        return cls.from_loaded_rules(rules).override(**overrides)

    @classmethod
    def from_loaded_rules(cls, rules: AndonRules) -> AndonThresholds:
        return cls(
            default_slowdown_c=rules.thermal.default_slowdown_c,
            thermal_margin_c=rules.thermal.warn_margin_c,
            memory_used_ratio=rules.memory.fb_used_ratio_alert,
            power_limit_ratio=rules.power.at_limit_ratio_alert,
            idle_util_pct=rules.idle.util_pct_below,
            idle_for_s=float(rules.idle.for_s),
        )

    def override(self, **overrides: Any) -> AndonThresholds:
        unknown = set(overrides) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown andon threshold(s): {', '.join(sorted(unknown))}")
        return replace(self, **overrides)

    def thermal_limit_c(self, slowdown_c: float | None) -> float:
        """The temperature at which a GPU with this slowdown temperature raises a thermal alert."""
        if self.thermal_c is not None:
            return self.thermal_c
        return (slowdown_c if slowdown_c is not None else self.default_slowdown_c) - self.thermal_margin_c

"""Loads config/health-rules.toml, the one reviewed file of thresholds, into typed settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import ConfigError

DEFAULT_RULES = Path(__file__).resolve().parents[2] / "config" / "health-rules.toml"

Severity = Literal["unhealthy", "degraded"]
Action = Literal["none", "restart_workload", "reset_gpu", "reboot_node", "inspect"]
# The escalation ladder: the same fault after an action moves one rung up.
LADDER: tuple[Action, ...] = ("none", "restart_workload", "reset_gpu", "reboot_node", "inspect")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Windows(_Section):
    short_s: int = Field(gt=0)
    long_s: int = Field(gt=0)
    xid_s: int = Field(gt=0)
    escalation_s: int = Field(gt=0)


class Availability(_Section):
    missing_after_s: int = Field(gt=0)


class Memory(_Section):
    dbe_volatile_fail: int = Field(ge=1)
    retired_pages_fail: int = Field(ge=1)
    retired_pending_warn: int = Field(ge=1)
    sbe_per_hour_warn: float = Field(gt=0)
    sbe_per_hour_fail: float = Field(gt=0)
    fb_used_ratio_alert: float = Field(gt=0, le=1)


class Thermal(_Section):
    default_slowdown_c: float
    warn_margin_c: float = Field(ge=0)


class Power(_Section):
    at_limit_ratio_alert: float = Field(gt=0)


class Pcie(_Section):
    replays_per_hour_warn: float = Field(gt=0)
    replays_per_hour_fail: float = Field(gt=0)


class Nvlink(_Section):
    crc_per_hour_warn: float = Field(gt=0)
    replay_recovery_fail: int = Field(ge=1)


class Idle(_Section):
    util_pct_below: float = Field(ge=0)
    for_s: int = Field(gt=0)


class XidRule(_Section):
    name: str
    severity: Severity
    action: Action


class Score(_Section):
    unhealthy_penalty: float = Field(ge=0)
    degraded_penalty: float = Field(ge=0)
    prediction_penalty: float = Field(ge=0)
    grades: list[tuple[float, str]]


class Prediction(_Section):
    base_per_day: float = Field(ge=0)
    sbe_per_hour: float = Field(ge=0)
    sbe_trend: float = Field(ge=0)
    retired_pages: float = Field(ge=0)
    remapped_rows_uncorrectable: float = Field(ge=0)
    dbe_30d: float = Field(ge=0)
    critical_xids_7d: float = Field(ge=0)
    thermal_minutes_24h: float = Field(ge=0)
    pcie_replays_per_hour: float = Field(ge=0)
    nvlink_errors_per_hour: float = Field(ge=0)


class Rules(_Section):
    windows: Windows
    availability: Availability
    memory: Memory
    thermal: Thermal
    power: Power
    pcie: Pcie
    nvlink: Nvlink
    idle: Idle
    xid: dict[int, XidRule]
    score: Score
    prediction: Prediction


def load_rules(path: Path = DEFAULT_RULES) -> Rules:
    try:
        return Rules.model_validate(tomllib.loads(path.read_text()))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"health rules {path}: {e}") from e
    except ValidationError as e:
        raise ConfigError(f"health rules {path}: {e}") from e

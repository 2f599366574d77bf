"""Loads config/health-rules.toml, the one reviewed file of thresholds, into typed settings.

The sections the Andon alerts share with the training library (thermal, power,
idle and the memory section's Andon key) are the library's
(gpuhealth.andon_rules); this module adds the scorer's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from gpuhealth.andon_rules import AndonMemory, AndonRules, read_rules_toml, validated_rules
from gpuhealth.andon_rules import RulesSection as _Section
from shared.contract.models_health import Action, Subsystem
from shared.gpu.nvlink_decode import Nvlink5Row, parse_nvlink5_table
from shared.gpu.xid_catalog import XidEntry, check_against_mapping, parse_catalog
from shared.plumbing.errors import ConfigError
from shared.settings.common import HEALTH_RULES_FILE

DEFAULT_RULES = HEALTH_RULES_FILE


class Windows(_Section):
    short_s: int = Field(gt=0)
    long_s: int = Field(gt=0)
    xid_s: int = Field(gt=0)
    escalation_s: int = Field(gt=0)


class Availability(_Section):
    missing_after_s: int = Field(gt=0)


class Memory(AndonMemory):
    model_config = ConfigDict(extra="forbid")  # the scorer reads the whole section

    dbe_volatile_fail: int = Field(ge=1)
    retired_pages_fail: int = Field(ge=1)
    retired_pending_warn: int = Field(ge=1)
    sbe_per_hour_warn: float = Field(gt=0)
    sbe_per_hour_fail: float = Field(gt=0)


class Pcie(_Section):
    replays_per_hour_warn: float = Field(gt=0)
    replays_per_hour_fail: float = Field(gt=0)


class Nvlink(_Section):
    crc_per_hour_warn: float = Field(gt=0)
    replay_recovery_fail: int = Field(ge=1)


class NvidiaAction(_Section):
    """One of NVIDIA's immediate actions ("resolution buckets") as this project's action, and why."""

    action: Action
    why: str = Field(min_length=1)


class XidCatalog(_Section):
    """Where the catalogue lives (beside this file) and how NVIDIA's actions map onto this project's."""

    file: str
    nvlink5_file: str  # NVIDIA's decode table for XIDs 144-150
    nvidia_actions: dict[str, NvidiaAction]

    def mapping(self) -> dict[str, Action]:
        return {name: mapped.action for name, mapped in self.nvidia_actions.items()}


class XidRepeats(_Section):
    """Application XIDs are the workload's fault: they escalate only when they keep coming back."""

    count: int = Field(ge=1)  # escalate when MORE than this many fall in the window
    window_s: int = Field(gt=0)


class Workflows(_Section):
    """How the workflow XIDs are judged from what accompanies them (services/scorer/workflows.py)."""

    companion_s: float = Field(gt=0)  # XIDs this close on one GPU accompany each other
    burst_s: float = Field(ge=0)  # occurrences of one XID this close are one occurrence
    events_per_code: int = Field(ge=1, le=1000)  # newest events of each workflow XID read per GPU


# What a pattern counts: XIDs of a code, XIDs of a catalogue class (its codes that are findings),
# events of a kind, a remediation that took (`recovered`: an unhealthy verdict that became healthy
# again), one the remediator carried out (`remediated`: a live plan that started on the GPU's node
# for it), any change of a verdict's state (`changed`), a remedy carried out (`remedy:reset_gpu`,
# `remedy:reboot_node`: gpu_remedies), or what a remedy resolved seen again within the pattern's
# window after it (`recurred:reset_gpu`, `recurred:reboot_node`: an XID the remedy's rung covers, or
# for a reboot a loss of the GPU).
_SIGNAL = (
    r"^(xid:[0-9]{1,6}|xid_class:(application|hardware|driver|unused)|event:[a-z_]{1,40}"
    r"|recovered|remediated|changed|(remedy|recurred):(reset_gpu|reboot_node))$"
)
Signal = Annotated[str, Field(pattern=_SIGNAL)]


class Pattern(_Section):
    """A count of signals on one GPU within a window that, reached, is a finding with an action."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,60}$")]
    counts: list[Signal] = Field(min_length=1, max_length=32)
    window_s: float = Field(gt=0, le=366 * 86400)
    at_least: int = Field(ge=1, le=1_000_000)
    # occurrences closer than this to the previous one join its burst, counted once per burst_s it spans
    burst_s: float = Field(default=0, ge=0, le=86400)
    # the finding stays this long after the occurrence that last reached the count (0: while counted)
    sticky_s: float = Field(default=0, ge=0, le=366 * 86400)
    # a signal after which earlier occurrences no longer count
    cancelled_by: list[Signal] = Field(default_factory=list, max_length=32)
    subsystem: Subsystem = "history"
    state: Literal["degraded", "unhealthy"]
    action: Action
    why: str = Field(min_length=1, max_length=300)


class Correlation(_Section):
    """Signals several GPUs show together: a job's crash, a fault of a host or a rack."""

    job_window_s: float = Field(gt=0, le=3600)  # application XIDs of one job's GPUs this close: one crash
    job_min_gpus: int = Field(ge=2, le=100_000)
    place_window_s: float = Field(gt=0, le=86400)  # hardware XIDs or losses on one host or rack this close
    place_min_gpus: int = Field(ge=2, le=100_000)


class Score(_Section):
    unhealthy_penalty: float = Field(ge=0)
    degraded_penalty: float = Field(ge=0)
    prediction_penalty: float = Field(ge=0)
    grades: list[tuple[float, str]]


class PredictionRules(_Section):
    recent_s: int = Field(gt=0)  # the recent part of the trend window
    trend_s: int = Field(gt=0)  # the whole window a trend is read over
    threshold: float = Field(gt=0, lt=1)  # p(fail in 30 d) at which a GPU counts as predicted to fail
    weights_file: str  # fitted weights: beside the rules file, else in the project's config/


class PredictorWeights(_Section):
    """The fitted logistic model (config/predictor-weights.toml, written by `make train-predictor`)."""

    intercept: float
    weights: dict[str, float]
    trained_on_seeds: list[int] = Field(default_factory=list)


class Rules(AndonRules):
    """The whole file: the Andon sections (thermal, power, idle, memory's Andon key) and the scorer's."""

    model_config = ConfigDict(extra="forbid")

    windows: Windows
    availability: Availability
    memory: Memory
    pcie: Pcie
    nvlink: Nvlink
    xid_catalog: XidCatalog
    xid: dict[int, XidEntry]  # NVIDIA's catalogue by code (config/xid-catalog.csv)
    nvlink5: tuple[Nvlink5Row, ...]  # NVIDIA's decode of XIDs 144-150 (config/nvlink5-decode.csv)
    workflows: Workflows
    patterns: list[Pattern] = Field(default_factory=list, max_length=100)
    correlation: Correlation
    xid_repeats: XidRepeats
    score: Score
    prediction: PredictionRules
    predictor: PredictorWeights

    @model_validator(mode="after")
    def _catalogue_follows_the_mapping(self) -> Rules:
        try:
            check_against_mapping(self.xid.values(), self.xid_catalog.mapping())
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _patterns_are_named_once(self) -> Rules:
        names = [p.name for p in self.patterns]
        if len(set(names)) != len(names):
            raise ValueError(f"patterns: a name is used twice in {names}")
        return self

    def xid_clear_s(self, code: int) -> int:
        known = self.xid.get(code)
        return known.clear_after_s if known and known.clear_after_s else self.windows.xid_s


def _beside(rules_path: Path, name: str) -> Path:
    """Beside the rules file; a rules file copied elsewhere alone falls back to the project's."""
    beside = rules_path.parent / name
    return beside if beside.exists() else DEFAULT_RULES.parent / name


def load_rules(path: Path = DEFAULT_RULES) -> Rules:
    """The rules file, with the predictor's weights and the XID catalogue from the files it names."""
    raw = read_rules_toml(path)
    section = raw.get("prediction")
    name = section.get("weights_file") if isinstance(section, dict) else None
    if isinstance(name, str) and "predictor" not in raw:
        raw["predictor"] = read_rules_toml(_beside(path, name))
    catalog = raw.get("xid_catalog")
    name = catalog.get("file") if isinstance(catalog, dict) else None
    if isinstance(name, str) and "xid" not in raw:
        where = _beside(path, name)
        try:
            text = where.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"health rules {path}: {e}") from e
        raw["xid"] = parse_catalog(text, source=f"xid catalogue {where}")
    name = catalog.get("nvlink5_file") if isinstance(catalog, dict) else None
    if isinstance(name, str) and "nvlink5" not in raw:
        where = _beside(path, name)
        try:
            text = where.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"health rules {path}: {e}") from e
        raw["nvlink5"] = parse_nvlink5_table(text, source=str(where))
    return validated_rules(Rules, raw, path)

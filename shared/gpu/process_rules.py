"""Classifies a GPU process (training, inference, llm_serving, gaming, compute) by ordered, reviewed rules.

The rules live in ``config/process-rules.toml`` (see its header for the
grammar). The first rule whose conditions all hold decides, and its name goes
with the answer; a process that no rule matches is ``compute`` by rule
``default``. Inputs are bounded before matching (command lines are cut at
4096 characters), so arbitrary text classifies in bounded time.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.contract.models_workload import ProcessClass
from shared.plumbing.errors import ConfigError

DEFAULT_RULES = Path(__file__).resolve().parents[2] / "config" / "process-rules.toml"
MAX_TEXT = 4096
_KEYS = {
    "name",
    "class",
    "executable",
    "command",
    "type",
    "min_memory_mib",
    "max_memory_mib",
    "min_sm_util_pct",
    "max_sm_util_pct",
    "launcher",
}
LAUNCHERS = frozenset({"torchrun", "deepspeed", "accelerate"})
_TYPES = {"compute", "graphics", "compute+graphics"}


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """What the rules look at; None where it is not known."""

    executable: str | None = None
    command_line: str | None = None
    type: str = "compute"
    used_memory_mib: int | None = None
    sm_util_pct: float | None = None
    launcher: str | None = None  # the launcher that started it (services/collector/launcher.py)


@dataclass(frozen=True, slots=True)
class Classification:
    process_class: ProcessClass
    rule: str


DEFAULT = Classification(ProcessClass.COMPUTE, "default")


def _within(value: float | None, low: float | None, high: float | None) -> bool:
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    process_class: ProcessClass
    executable: tuple[re.Pattern[str], ...] = ()
    command: tuple[re.Pattern[str], ...] = ()
    type: str | None = None
    min_memory_mib: float | None = None
    max_memory_mib: float | None = None
    min_sm_util_pct: float | None = None
    max_sm_util_pct: float | None = None
    launcher: frozenset[str] = frozenset()

    def matches(self, facts: ProcessFacts) -> bool:
        if self.type is not None and facts.type != self.type:
            return False
        if self.launcher and facts.launcher not in self.launcher:
            return False
        if not _within(facts.used_memory_mib, self.min_memory_mib, self.max_memory_mib):
            return False
        if not _within(facts.sm_util_pct, self.min_sm_util_pct, self.max_sm_util_pct):
            return False
        if not self.executable and not self.command:
            return True
        exe = (facts.executable or "")[:MAX_TEXT]
        cmd = (facts.command_line or "")[:MAX_TEXT]
        return any(p.search(exe) for p in self.executable if exe) or any(
            p.search(cmd) for p in self.command if cmd
        )


def _patterns(name: str, key: str, value: Any) -> tuple[re.Pattern[str], ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"process rule {name!r}: {key} must be a list of strings")
    try:
        return tuple(re.compile(v, re.IGNORECASE) for v in value)
    except re.error as e:
        raise ConfigError(f"process rule {name!r}: bad {key} pattern: {e}") from e


def _number(name: str, key: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"process rule {name!r}: {key} must be a non-negative number")
    return float(value)


def _rule(entry: Any) -> Rule:
    if not isinstance(entry, dict):
        raise ConfigError("each [[rule]] must be a table")
    name = entry.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
        raise ConfigError(f"process rule name {name!r} must be a short lower-case identifier")
    unknown = set(entry) - _KEYS
    if unknown:
        raise ConfigError(f"process rule {name!r}: unknown keys {sorted(unknown)}")
    try:
        process_class = ProcessClass(str(entry.get("class")))
    except ValueError as e:
        raise ConfigError(
            f"process rule {name!r}: class must be one of {[c.value for c in ProcessClass]}"
        ) from e
    kind = entry.get("type")
    if kind is not None and kind not in _TYPES:
        raise ConfigError(f"process rule {name!r}: type must be one of {sorted(_TYPES)}")
    launcher = entry.get("launcher", [])
    if not isinstance(launcher, list) or not all(isinstance(v, str) and v in LAUNCHERS for v in launcher):
        raise ConfigError(f"process rule {name!r}: launcher must be a list of {sorted(LAUNCHERS)}")
    rule = Rule(
        name=name,
        launcher=frozenset(launcher),
        process_class=process_class,
        executable=_patterns(name, "executable", entry.get("executable", [])),
        command=_patterns(name, "command", entry.get("command", [])),
        type=kind,
        **{
            k: _number(name, k, entry.get(k))
            for k in ("min_memory_mib", "max_memory_mib", "min_sm_util_pct", "max_sm_util_pct")
        },
    )
    if rule == Rule(name=name, process_class=process_class):
        raise ConfigError(f"process rule {name!r} has no condition: it would match everything")
    return rule


class ProcessRules:
    """The ordered rules of one config file."""

    def __init__(self, rules: list[Rule]) -> None:
        names = [r.name for r in rules]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ConfigError(f"process rule names must be unique: {duplicated}")
        self.rules = rules

    @classmethod
    def from_toml(cls, text: str) -> ProcessRules:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"process rules are not valid TOML: {e}") from e
        entries = document.get("rule")
        if not isinstance(entries, list) or not entries:
            raise ConfigError("process rules need at least one [[rule]]")
        return cls([_rule(e) for e in entries])

    @classmethod
    def load(cls, path: Path = DEFAULT_RULES) -> ProcessRules:
        try:
            return cls.from_toml(path.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read process rules {path}: {e}") from e

    def classify(self, facts: ProcessFacts) -> Classification:
        for rule in self.rules:
            if rule.matches(facts):
                return Classification(rule.process_class, rule.name)
        return DEFAULT

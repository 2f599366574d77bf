"""Loads config/remediation-policy.toml, the reviewed file of what the remediator may do, into typed settings.

The policy says, per recommended action of the scorer's ladder
(shared.contract.models_health), whether the remediator carries it out on its own
(``automatic``), waits for an operator's approval (``approval``) or never acts
(``never``), which steps its plan takes, and how many plans of that class may
start within a window before the next waits for approval. It also holds the
circuit breaker's bounds, the cap on the nodes it holds out at once, the
per-node rate limit, the drain modes per namespace and deadline, and what a
node must show before it returns to service. Every action of the ladder must
be listed: a new rung added to the ladder without a reviewed policy is an
error at start, not a silent default.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.contract.models_health import LADDER
from shared.contract.models_remediation import STEPS, Step
from shared.plumbing.errors import ConfigError

DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "config" / "remediation-policy.toml"

Mode = Literal["automatic", "approval", "never"]
DrainMode = Literal["evict", "force", "skip"]
# Steps that take a node out of service; a plan that has one keeps the node out until `return`.
TAKES_OUT: frozenset[Step] = frozenset({"cordon", "drain"})
NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Breaker(_Section):
    """At most `max_nodes` nodes, or `max_fleet_percent` of the fleet, taken out within `window_s`."""

    max_nodes: int = Field(ge=1, le=1_000_000)
    max_fleet_percent: float = Field(gt=0, le=100)
    window_s: int = Field(ge=1, le=30 * 86400)

    def bound(self, fleet_nodes: int) -> int:
        """How many distinct nodes may be taken out within the window, for a fleet of `fleet_nodes`.

        The smaller of the two bounds, rounded down; at least one node, so that one bad node in a
        small fleet can still be taken out (the breaker exists for the mass failure, not the first).
        """
        by_share = math.floor(max(fleet_nodes, 0) * self.max_fleet_percent / 100)
        return max(1, min(self.max_nodes, by_share))


class NodesOut(_Section):
    """At most `max_nodes` nodes, or `max_fleet_percent` of the inventory's nodes, held out by the remediator
    at once, however slowly they went out (the breaker bounds a rate; this bounds the total): the nodes of
    its plans past their cordon, its own cordons, and the nodes its plans left out for a person."""

    max_nodes: int = Field(ge=1, le=1_000_000)
    max_fleet_percent: float = Field(gt=0, le=100)

    def bound(self, fleet_nodes: int) -> int:
        """How many nodes may be out at once for a fleet of `fleet_nodes`: the smaller bound, rounded down,
        at least one (one bad node of a small fleet can still be taken out)."""
        by_share = math.floor(max(fleet_nodes, 0) * self.max_fleet_percent / 100)
        return max(1, min(self.max_nodes, by_share))


class RateLimit(_Section):
    """At most `per_node` plans started on one node within `window_s`; the next waits for approval."""

    per_node: int = Field(ge=1, le=1000)
    window_s: int = Field(ge=1, le=365 * 86400)


class Drain(_Section):
    """How pods leave a node: per namespace `evict` (the Eviction API, PodDisruptionBudgets respected; pods
    still there at the deadline fail the drain), `force` (evicted the same way, but pods still there at the
    deadline do not hold the plan back) or `skip` (left alone, like DaemonSet pods)."""

    deadline_s: int = Field(ge=1, le=7 * 86400)
    grace_period_s: int | None = Field(default=None, ge=0, le=86400)  # None: each pod's own
    default_mode: DrainMode = "evict"
    namespaces: dict[str, DrainMode] = Field(default_factory=dict)
    slurm_past_deadline: Literal["fail", "proceed"] = "fail"

    @field_validator("namespaces")
    @classmethod
    def _names(cls, value: dict[str, DrainMode]) -> dict[str, DrainMode]:
        import re

        bad = [name for name in value if not re.match(NAMESPACE, name)]
        if bad:
            raise ValueError(f"not Kubernetes namespace names: {bad}")
        return value

    def mode(self, namespace: str) -> DrainMode:
        return self.namespaces.get(namespace, self.default_mode)


class Validation(_Section):
    """What a node shows before it returns: its GPUs again (same identities), the compute check, and
    `healthy_cycles` scoring cycles in a row all healthy, within `timeout_s`."""

    healthy_cycles: int = Field(ge=1, le=1000)
    compute_check: bool
    timeout_s: int = Field(ge=1, le=7 * 86400)


class ActionPolicy(_Section):
    mode: Mode
    steps: tuple[Step, ...]
    # per-class limit: plans of this action started within window_s, fleet-wide, before the next waits
    max_per_window: int | None = Field(default=None, ge=1)
    window_s: int = Field(default=3600, ge=1)
    # the action whose plan follows when this one's validation (or GPU reset) fails; None: the node
    # stays out for a person
    on_failure: str | None = None
    # mode "approval" only: the operator's approval is for the work the plan stops. A held plan starts
    # without it when a finding the remediator acts on by itself, with a drain (a reset), joins it: that
    # finding's own plan would stop the node's work anyway (still within the breaker, the nodes-out cap
    # and the limits)
    starts_when_joined: bool = False

    @model_validator(mode="after")
    def _coherent(self) -> ActionPolicy:
        steps = list(self.steps)
        if self.mode != "never" and not steps:
            raise ValueError("an action the remediator may take needs steps")
        if len(set(steps)) != len(steps):
            raise ValueError(f"a step is listed twice in {steps}")
        if steps != sorted(steps, key=STEPS.index):
            raise ValueError(f"steps must come in the order {list(STEPS)}")
        for needs, step in (("validate", "return"), ("cordon", "drain"), ("cordon", "validate")):
            if step in steps and needs not in steps:
                raise ValueError(f"step {step!r} needs {needs!r} before it")
        if "return" in steps and "keep_out" in steps:
            raise ValueError("a plan either returns the node or keeps it out, not both")
        if any(s in steps for s in ("reset_gpu", "reboot")) and not TAKES_OUT & set(steps):
            raise ValueError("a reset or a reboot needs the node cordoned first")
        if self.starts_when_joined and self.mode != "approval":
            raise ValueError("starts_when_joined is for an action whose plans wait for approval")
        return self


class Policy(_Section):
    version: Literal[1]
    breaker: Breaker
    nodes_out: NodesOut
    rate_limit: RateLimit
    drain: Drain
    validation: Validation
    actions: dict[str, ActionPolicy]
    # alert kinds that act, as "<source>:<kind>" -> action (the verdict of the same finding
    # usually acts first; an alert listed here acts too, and joins the node's plan)
    alerts: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _complete(self) -> Policy:
        missing = [a for a in LADDER if a not in self.actions]
        unknown = [a for a in self.actions if a not in LADDER]
        if missing or unknown:
            raise ValueError(
                f"[actions] must list exactly the ladder's actions {list(LADDER)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else "")
            )
        wrong = {kind: action for kind, action in self.alerts.items() if action not in LADDER}
        if wrong:
            raise ValueError(f"[alerts] names actions not on the ladder: {wrong}")
        training = [kind for kind in self.alerts if kind.startswith("training:")]
        if training:
            raise ValueError(
                f"[alerts] lists training jobs' alerts {training}: they are not signed by the scorer, and the"
                " remediator acts on nothing it cannot verify"
            )
        for action, rules in self.actions.items():
            after = rules.on_failure
            if after is not None and (after not in LADDER or LADDER.index(after) <= LADDER.index(action)):
                raise ValueError(
                    f"actions.{action}.on_failure: {after!r} is not above {action} in the ladder"
                )
        return self

    def for_action(self, action: str) -> ActionPolicy:
        """The policy of `action`; one not on the ladder is never acted on."""
        return self.actions.get(action, ActionPolicy(mode="never", steps=()))


def load_policy(path: Path = DEFAULT_POLICY) -> Policy:
    """The policy in `path`; ConfigError naming the file and the field when it is unreadable or invalid."""
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the remediation policy: {e}") from e
    try:
        return Policy.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "policy"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ConfigError(f"{path}: {where}: {first['msg']}{more}") from e

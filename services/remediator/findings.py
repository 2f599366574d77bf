"""What the remediator answers: a verdict (gpu-health) or an alert (gpu-alerts) as a `Finding`, and its node.

A finding's `decision_key` names the message it came from (the verdict's GPU,
subsystem and cycle; the alert's id and state), so a redelivered message finds
the decision already taken. A GPU's node is the hostname its message carries
(the collector's, from the inventory) unless the node map says otherwise; the
node map also names the node in each scheduler where that differs from the
hostname (a Kubernetes node name, a Slurm NodeName).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuhealth.contract.training import TrainingAlert
from shared.contract.models import GPU_UUID_PATTERN, to_json
from shared.contract.models_health import GpuAlert, HealthVerdict
from shared.plumbing.errors import ConfigError

from .policy import Policy

# A name a scheduler can carry: Kubernetes' DNS subdomain (lower case), Slurm's NodeName (any case).
NODE_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$"


@dataclass(frozen=True, slots=True)
class Finding:
    """One verdict or alert that may call for a remediation."""

    decision_key: str
    topic: str
    gpu_uuid: str
    hostname: str  # as the message carried it ("" when its producer did not know)
    action: str  # the ladder's action the finding calls for ("none": nothing)
    name: str  # what was found (the rule, or the alert's kind): named in the taint and the Slurm reason
    message: dict[str, Any] = field(compare=False)


def from_verdict(verdict: HealthVerdict, topic: str) -> Finding:
    name = verdict.rule or f"{verdict.subsystem}_{verdict.state}"
    action = verdict.action if verdict.state != "healthy" else "none"
    key = f"{topic}/{verdict.gpu_uuid}/{verdict.subsystem}/{to_json(verdict)['time']}"
    return Finding(key, topic, verdict.gpu_uuid, verdict.hostname, action, name, to_json(verdict))


def from_alert(alert: GpuAlert, topic: str, policy: Policy) -> Finding:
    """The alert as a finding; its action is the policy's for its source and kind ("none" unless listed)."""
    message = to_json(alert)
    if isinstance(alert, TrainingAlert):
        key = f"{topic}/training/{alert.gpu_uuid}/{alert.kind}/{alert.state}/{message['time']}"
        hostname, kind = "", str(alert.kind)
    else:
        key = f"{topic}/scorer/{alert.alert_id}/{alert.state}"
        hostname, kind = alert.hostname, alert.kind
    action = policy.alerts.get(f"{alert.source}:{kind}", "none") if alert.state == "open" else "none"
    return Finding(key, topic, alert.gpu_uuid, hostname, action, kind, message)


class _HostNames(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kubernetes: str | None = Field(default=None, pattern=NODE_NAME)
    slurm: str | None = Field(default=None, pattern=NODE_NAME)


class _NodeMapFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # GPU UUID -> hostname, for GPUs whose messages carry none or the wrong one
    gpus: dict[str, str] = Field(default_factory=dict)
    # hostname -> the node's name in each scheduler, where it differs
    hosts: dict[str, _HostNames] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeMap:
    """Where a GPU is: its hostname, and that host's name in each scheduler."""

    gpus: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, dict[str, str]] = field(default_factory=dict)

    def hostname(self, gpu_uuid: str, carried: str) -> str:
        return self.gpus.get(gpu_uuid, carried)

    def scheduler_name(self, hostname: str, scheduler: str) -> str:
        return self.hosts.get(hostname, {}).get(scheduler, hostname)


def load_node_map(path: Path | None) -> NodeMap:
    """The node map in `path` (TOML: [gpus] uuid = "host"; [hosts."host"] kubernetes = "...", slurm = "...");
    an empty map when None. ConfigError naming the entry when it is invalid."""
    if path is None:
        return NodeMap()
    try:
        with path.open("rb") as f:
            parsed = _NodeMapFile.model_validate(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the node map: {e}") from e
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"{path}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from e
    bad = [u for u in parsed.gpus if not re.match(GPU_UUID_PATTERN, u)]
    bad += [h for h in (*parsed.gpus.values(), *parsed.hosts) if not re.match(NODE_NAME, h)]
    if bad:
        raise ConfigError(f"{path}: not GPU UUIDs or node names: {bad[:5]}")
    hosts = {h: {k: v for k, v in names.model_dump().items() if v} for h, names in parsed.hosts.items()}
    return NodeMap(gpus=dict(parsed.gpus), hosts=hosts)


def valid_node(hostname: str) -> bool:
    """Whether a hostname can name a node in a scheduler (a hostile or empty one cannot)."""
    return bool(re.match(NODE_NAME, hostname))

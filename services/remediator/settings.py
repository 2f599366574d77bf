"""GPUHEALTH_REMEDIATOR__*: dry-run, the policy file, the node map, and how each driver reaches its system.

The keyring of the scorer's public keys is needed: the remediator acts only on
verdicts and alerts it can verify (trust.py). Dry-run is the default: the
remediator then records every decision and step it would have carried out
and touches no scheduler and no node. Acting needs
``GPUHEALTH_REMEDIATOR__DRY_RUN=false`` and at least one driver enabled.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.contract.signing import SigningSettings
from shared.settings.common import Section, Settings

from .drivers.node_exec import Command, Operation
from .policy import DEFAULT_POLICY


class KubernetesSection(Section):
    """The Kubernetes driver: cordon, taint, drain by eviction, uncordon."""

    enabled: bool = False
    """Act on Kubernetes nodes (in a live run; a dry run reaches no scheduler)."""
    kubeconfig: Path | None = None
    """The remediator's own kubeconfig: the user deploy/kubernetes/remediator-rbac.yaml binds."""
    context: str | None = None
    """The kubeconfig's context to use; unset: its current-context."""
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Seconds one API server request may take."""


class SlurmSection(Section):
    """The Slurm driver: drain with a reason, resume (scontrol and sinfo, with the operator's rights)."""

    enabled: bool = False
    """Act on Slurm nodes (in a live run)."""
    conf: Path | None = None
    """SLURM_CONF for scontrol and sinfo; unset: Slurm's own default."""
    bin_dir: Path | None = None
    """Where scontrol and sinfo are; unset: the PATH."""
    timeout_s: float = Field(default=30.0, gt=0, le=300)
    """Seconds one scontrol or sinfo may take."""


class RemediatorSection(Section):
    """The remediation service (`python -m services.remediator`)."""

    dry_run: bool = True
    """Record what would be done and do nothing: the default. `false` acts through the enabled drivers."""
    policy_file: Path = DEFAULT_POLICY
    """The reviewed policy: what may be done on its own, what waits for approval, the breaker's bounds."""
    node_map_file: Path | None = None
    """TOML mapping GPUs to hosts (`[gpus]`) and hosts to scheduler node names (`[hosts."h"]`); unset:
    each verdict's hostname, named the same in every scheduler."""
    signing: SigningSettings = Field(default_factory=SigningSettings)
    """What the remediator believes (`trusted_keys_file`, needed) and how old a message may be."""
    group_id: str = "gpu-health-remediator"
    """The consumer group reading gpu-health and gpu-alerts; a dry run's is this with `.dry-run` after
    it, so a dry run beside a live remediator reads every message the live one reads."""
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    """The Kubernetes driver."""
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    """The Slurm driver."""
    exec: dict[Operation, Command] = Field(default_factory=dict)
    """What runs on the node, per operation (`reset_gpu`, `reboot`, `compute_check`): a command
    (`{"argv": [...]}`, with `{node}`, `{gpu_uuid}`, `{gpu_index}`, `{plan_id}`) or a webhook
    (`{"url": ...}`), per GPU unless `per_gpu` is false. An operation not set fails its step."""
    poll_timeout_s: float = Field(default=0.5, gt=0, le=10)
    """Seconds one poll of the topics waits for a message."""
    batch_size: int = Field(default=200, ge=1, le=10_000)
    """Messages decided per batch (their offsets are committed after it)."""
    step_retry_s: float = Field(default=5.0, gt=0, le=600)
    """Seconds before a driver that could not answer is asked again (until the drain's deadline)."""
    drain_look_s: float = Field(default=2.0, gt=0, le=600)
    """Seconds between two looks at a drain or a validation in progress."""
    metrics_port: int = Field(default=9503, ge=0, le=65535)
    """Port of the remediator's own /metrics."""
    metrics_bind: str = "127.0.0.1"
    """Address /metrics listens on."""

    @property
    def consumer_group(self) -> str:
        """The group this mode reads in: dry run and live never share one (nor their decisions)."""
        return f"{self.group_id}.dry-run" if self.dry_run else self.group_id


class RemediatorSettings(Settings):
    remediator: RemediatorSection = Field(default_factory=RemediatorSection)
    """The remediation service."""

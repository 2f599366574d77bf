"""The mock fleet's settings (GPUHEALTH_MOCK__*): its shape, where it listens, and its clock."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.settings.common import Section, Settings

from .fleet import DEFAULT_MODELS, ComputeCheck


class MockSettings(Section):
    """GPUHEALTH_MOCK__*: the fleet's shape, where it listens, and its clock."""

    nodes: int = Field(default=4, ge=1, le=4096)
    """Simulated nodes, each answering on its own port."""
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    """GPUs per node."""
    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    """GPU models, cycled across nodes (`h100-sxm`, `a100-sxm4-80gb`, `v100-sxm2-32gb`)."""
    seed: int = 42
    """The same seed gives the same fleet: the same UUIDs, and the same readings at the same simulated
    times."""
    bind: str = "127.0.0.1"
    """Address the nodes and the admin endpoint listen on."""
    base_port: int = Field(default=9400, ge=0, le=65535)
    """Node *i* answers on this port + *i*."""
    admin_port: int = Field(default=9399, ge=0, le=65535)
    """The admin endpoint: faults, ground truth, the fleet, the mock's own `/metrics`."""
    hostname_prefix: str = Field(default="gpu-node-", pattern=r"^[A-Za-z0-9._-]{1,40}$")
    """Node host names are this and a two-digit number."""
    driver_version: str = "550.90.07"
    """The driver version the nodes report."""
    workload_labels: bool = True
    """Label each GPU's series with its simulated job's container, namespace and pod, as dcgm-exporter
    does with Kubernetes mapping."""
    speed: float = Field(default=1.0, gt=0, le=1_000_000)
    """Simulated seconds per real second; other than 1, each sample line carries its simulated timestamp."""
    sim_start: str = "now"
    """Where the simulated clock starts: `now`, a time before now (`-24h`, `-90m`: `-<n>[smhd]`) or an
    ISO-8601 time."""
    compute_check: ComputeCheck = "hard_failure"
    """What fails `POST /compute-check` on a GPU (the remediator's validation): an active `hard_failure`
    (a DBE, a failed remap, a fall off the bus, a critical XID), `any_fault` active but a heavy workload,
    or `nothing`. A fault stays until a remedy that fixes it (`POST /reset-gpu`, `POST /reboot`), a repair,
    its duration or `DELETE /faults/<id>` ends it."""
    scenario: Path | None = None
    """A JSON file of scheduled faults:
    `{"faults": [{"kind": ..., "node": ..., "gpu": ..., "after_s": ...}]}`."""


class MockDcgmSettings(Settings):
    mock: MockSettings = Field(default_factory=MockSettings)

"""The collector's settings: GPUHEALTH_COLLECTOR__* (what it reads, how often, where the node is, its spool)
and GPUHEALTH_PROCESSES__* (the processes on its GPUs)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field

from shared.settings.common import Section, Settings

from .processes import ProcessSection


class CollectorSection(Section):
    """GPUHEALTH_COLLECTOR__*: what the collector reads, how often, where the node is, and its spool."""

    source: Literal["auto", "dcgm", "mock", "nvml", "smi"] = "auto"
    """`dcgm` (dcgm-exporter over HTTP), `mock` (the same, samples say `source: mock`), `nvml`, `smi`
    (nvidia-smi), or `auto`: dcgm-exporter if it answers, else NVML, else nvidia-smi."""
    dcgm_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9400/metrics"])
    """The exporters to scrape: one collector can read several (e.g. every node of the mock fleet)."""
    interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    """Poll period; polls tick on a monotonic schedule and skip (and count) ticks they overran."""
    scrape_timeout_s: float = Field(default=5.0, gt=0, le=120)
    """How long one scrape of an exporter may take."""
    collector_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    """Names the collector in every message (and its spool file)."""
    cluster: str | None = None
    """This node's cluster."""
    datacenter: str | None = None
    """This node's datacenter."""
    region: str | None = None
    """This node's region."""
    rack: str | None = None
    """This node's rack."""
    inventory_file: Path | None = None
    """A CSV `hostname,rack,datacenter,cluster,region`; it wins over the settings for the hosts it lists."""
    max_queued: int = Field(default=500_000, ge=100, le=10_000_000)
    """Messages held while the broker is away (about 1 KiB each); beyond it new ones are dropped, counted
    and logged."""
    metrics_port: int = Field(default=9500, ge=0, le=65535)
    """Port of the collector's own `/metrics`."""
    metrics_bind: str = "127.0.0.1"
    """Address of the collector's own `/metrics`."""
    kernel_log: Literal["off", "auto", "kmsg", "journal", "mock"] = "off"
    """Also read XIDs from this host's kernel log (`/dev/kmsg` or `journalctl`), beside any source; `mock`:
    each mock fleet node's (`/journal` beside each of `dcgm_urls`)."""
    xid_fold_s: float = Field(default=10.0, ge=0, le=3600)
    """Repeats of one XID on one GPU within this many seconds of its first line are one event, published
    at once and again when the window ends with the exact count and the last line's time (0: every line
    its own event)."""
    systems_interval_s: float = Field(default=300.0, ge=0, le=86_400)
    """NVML and nvidia-smi nodes: how often identity is re-read for `gpu-systems` (0: only at start)."""
    shutdown_flush_s: float = Field(default=5.0, ge=0, le=600)
    """On SIGTERM, how long the broker gets to take what is queued before the rest is spooled."""
    spool_path: Path | None = None
    """Where what the broker did not take at shutdown is kept, to be sent first at the next start;
    unset: `~/.cache/gpu-health/spool/collector-<collector_id>.jsonl`."""
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=4096, le=64 * 1024**3)
    """The spool's bound; beyond it the newest messages are dropped, counted and logged."""
    spool_check_timeout_s: float = Field(default=15.0, gt=0, le=600)
    """Before resending the spool, how long to read Kafka back for messages it already has."""

    def spool_file(self) -> Path:
        if self.spool_path is not None:
            return self.spool_path
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.collector_id)
        return Path.home() / ".cache" / "gpu-health" / "spool" / f"collector-{name}.jsonl"


class CollectorSettings(Settings):
    collector: CollectorSection = Field(default_factory=CollectorSection)
    processes: ProcessSection = Field(default_factory=ProcessSection)

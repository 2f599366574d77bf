"""The scorer's settings (GPUHEALTH_SCORER__*): how often the fleet is judged, as of when, by which rules."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import Field, field_validator

from shared.contract.signing import SigningSettings
from shared.settings.common import Section, Settings

from .rules_config import DEFAULT_RULES


class ScorerSection(Section):
    """GPUHEALTH_SCORER__*: how often the fleet is judged, as of when, by which rules."""

    interval_s: float = Field(default=30.0, ge=1, le=3600)
    """How often a cycle runs: it judges every GPU whose verdict can have changed (a finding, an alert, an
    event, silence, or its own minute come round: `rejudge_every_s`)."""
    rejudge_every_s: int = Field(default=60, ge=1, le=3600)
    """A GPU with nothing new is judged again this often (the rollup's minute), each at its own phase."""
    predict_every_s: float = Field(default=300.0, ge=1)
    """How often each GPU's failure prediction is recomputed (at its next judgement after this long)."""
    as_of: str = "now"
    """The time judged: `now` (a live fleet), `latest` (the fleet's newest sample: a replay, or the mock
    on an accelerated clock) or an ISO-8601 time (one cycle, then exit)."""
    rules_file: Path = DEFAULT_RULES
    """Every threshold and window of the health rules."""
    metrics_port: int = Field(default=9502, ge=0, le=65535)
    """Port of the scorer's `/metrics`, verdicts included."""
    metrics_bind: str = "127.0.0.1"
    """Address of the scorer's `/metrics`."""
    events: bool = True
    """Judge a GPU at once on each of its gpu-events messages (the event fast path), as a member of `group`;
    off, this process judges every GPU, and only every cycle."""
    group: str = Field(default="gpuhealth-scorer", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    """The scorers' consumer group on gpu-events: its members share the fleet by the topic's partitions."""
    signing: SigningSettings = Field(default_factory=SigningSettings)
    """How the scorer signs what it publishes (`private_key_file`): a remediator acts on nothing unsigned."""
    session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    """How long the group waits on a silent scorer before its GPUs move to the others. Kept under
    `interval_s`, a scorer that dies leaves its GPUs unjudged for at most two intervals."""
    event_batch: int = Field(default=500, ge=1, le=100_000)
    """Most gpu-events messages judged in one transaction."""
    cycle_chunk: int = Field(default=500, ge=1, le=1_000_000)
    """Most GPUs a cycle writes in one transaction (it reads and judges its share at once). Each chunk
    commits and is published before the next is written, so an event on a GPU the cycle is writing waits
    for one chunk, not the cycle, and a stop is heard between chunks."""

    @field_validator("as_of")
    @classmethod
    def _as_of(cls, value: str) -> str:
        if value not in ("now", "latest"):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"as_of must be 'now', 'latest' or an ISO time, not {value!r}") from None
        return value


class ScorerSettings(Settings):
    scorer: ScorerSection = Field(default_factory=ScorerSection)

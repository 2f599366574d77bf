"""The verifier's settings: the broker and topic its audit chain lives on (GPUHEALTH_KAFKA__*,
GPUHEALTH_TOPICS__VERIFICATIONS), and how long it waits on them (GPUHEALTH_VERIFIER__*).

Read only by the commands that reach the broker (`compute` without `--no-publish`, `audit`, and
`log_operation`): the others run on a machine with no configuration at all.
"""

from __future__ import annotations

from pydantic import Field

from shared.settings.common import Section, Settings, load_settings


class VerifierSection(Section):
    """GPUHEALTH_VERIFIER__*: how long the verifier waits on the broker."""

    kafka_timeout_s: float = Field(default=60.0, ge=1, le=3600)
    """How long the audit chain's topic may take to be prepared and read to its end (every GPU's chain head,
    before a record is appended), and each appended record to be acknowledged. `audit --timeout-s`
    overrides it for one audit."""


class VerifierSettings(Settings):
    """`python -m services.verifier`'s settings, and `services.verifier.oplog`'s."""

    verifier: VerifierSection = Field(default_factory=VerifierSection)


def load_verifier_settings() -> VerifierSettings:
    """The verifier's settings from the environment; ConfigError naming a variable that is invalid."""
    return load_settings(VerifierSettings)

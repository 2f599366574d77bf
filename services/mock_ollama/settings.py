"""The stand-in Ollama's settings (GPUHEALTH_MOCK_OLLAMA__*)."""

from __future__ import annotations

from pydantic import Field

from shared.settings.common import Section, Settings


class MockOllamaSection(Section):
    """GPUHEALTH_MOCK_OLLAMA__*: the stand-in Ollama."""

    host: str = "127.0.0.1"
    """Address the stand-in Ollama listens on."""
    port: int = Field(default=11434, ge=0, le=65535)
    """Port the stand-in Ollama listens on (Ollama's own)."""
    time_scale: float = Field(default=1.0, ge=0, le=100)
    """Its models' load, prompt and generation times are nominal times multiplied by this (0: no waits)."""


class MockOllamaSettings(Settings):
    mock_ollama: MockOllamaSection = Field(default_factory=MockOllamaSection)

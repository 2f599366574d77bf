"""The LLM monitor's settings (GPUHEALTH_LLM__*): the Ollama proxy, the servers polled and the probe."""

from __future__ import annotations

import socket

from pydantic import Field, field_validator

from shared.settings.common import Section, Settings

from .proxy import DEFAULT_ALLOW, Allowed


class LlmSection(Section):
    """GPUHEALTH_LLM__*: the Ollama proxy, the servers polled and the synthetic probe."""

    ollama_url: str = Field(default="http://127.0.0.1:11434", pattern=r"^http://[^\s/]+$")
    """The Ollama server the proxy forwards to and the monitor polls."""
    listen_host: str = "127.0.0.1"
    """Address of the proxy that clients use in place of Ollama."""
    listen_port: int = Field(default=11435, ge=0, le=65535)
    """Port of the proxy that clients use in place of Ollama's."""
    proxy_allow: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOW), min_length=1, max_length=200)
    """The requests the proxy relays, as `METHOD /path` (a trailing `*`: any path under it), as JSON.
    The default is Ollama's inference and read-only endpoints: model management (/api/pull,
    /api/delete, /api/create, /api/push, /api/copy) is refused (403)."""
    proxy_max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    """The largest request body the proxy takes (413 past it)."""
    proxy_head_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """A request's head must arrive within this of the connection opening or of the previous answer
    (408; an idle kept-alive connection is closed)."""
    proxy_body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """A request's body must arrive within this of its head (408)."""
    proxy_max_connections: int = Field(default=256, ge=1, le=100_000)
    """Client connections served at once; one more gets a 503 and is closed."""
    poll_interval_s: float = Field(default=15.0, ge=1, le=3600)
    """How often Ollama's version and loaded models, and vLLM's metrics, are recorded."""
    vllm_urls: list[str] = Field(default_factory=list, max_length=64)
    """vLLM servers whose `/metrics` are scraped."""
    probe_model: str | None = Field(default=None, max_length=253)
    """A model to probe with a bounded synthetic request (recorded as `source: probe`); unset: no probe."""
    probe_prompt: str = Field(default="Say hello in five words.", max_length=2000)
    """The probe's prompt."""
    probe_max_tokens: int = Field(default=32, ge=1, le=256)
    """The most tokens a probe asks for."""
    probe_interval_s: float = Field(default=60.0, ge=10, le=86_400)
    """How often the probe runs."""
    probe_timeout_s: float = Field(default=60.0, ge=1, le=600)
    """How long a probe may take."""
    monitor_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    """Names the monitor in its messages."""
    metrics_port: int = Field(default=9504, ge=0, le=65535)
    """Port of the monitor's own `/metrics`."""
    metrics_bind: str = "127.0.0.1"
    """Address of the monitor's own `/metrics`."""

    @field_validator("proxy_allow")
    @classmethod
    def _allow(cls, value: list[str]) -> list[str]:
        Allowed(value)  # ValueError names a malformed entry
        return value


class LlmSettings(Settings):
    llm: LlmSection = Field(default_factory=LlmSection)

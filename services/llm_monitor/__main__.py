"""`python -m services.llm_monitor`: the Ollama proxy, server polls and the probe, publishing to llm-sessions.

Clients talk to the proxy (GPUHEALTH_LLM__LISTEN_PORT, default 11435) as they
would to Ollama (GPUHEALTH_LLM__OLLAMA_URL). Every `poll_interval_s` the
monitor records what Ollama has loaded and, for each of `vllm_urls`, what vLLM
reports. With `probe_model` set, a bounded synthetic request runs every
`probe_interval_s`. Messages are keyed by the server's URL. SIGTERM: stop
accepting, flush, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field, field_validator

from shared.contract.models import to_json
from shared.contract.models_workload import LlmServerStatus, LlmSession
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service
from shared.settings.common import Section, Settings

from .probe import probe_once
from .proxy import DEFAULT_ALLOW, Allowed, OllamaProxy
from .servers import VllmScraper, poll_ollama

log = logging.getLogger("services.llm_monitor")


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


class Monitor:
    def __init__(self, settings: LlmSettings, producer: JsonProducer, registry: CollectorRegistry) -> None:
        self.cfg, self.topic, self.producer = settings.llm, settings.topics.llm_sessions, producer
        self.sessions = Counter(
            "gpuhealth_llm_sessions", "Requests measured", ["source", "ok"], registry=registry
        )
        self.up = Gauge(
            "gpuhealth_llm_server_up",
            "Whether the server answered its last poll",
            ["server"],
            registry=registry,
        )
        self.dropped = Counter(
            "gpuhealth_llm_dropped", "Messages that could not be queued", registry=registry
        )

    def publish(self, message: LlmSession | LlmServerStatus) -> None:
        if isinstance(message, LlmSession):
            self.sessions.labels(message.source, str(message.ok).lower()).inc()
        else:
            self.up.labels(message.server).set(1 if message.up else 0)
        try:
            self.producer.produce(self.topic, message.server, to_json(message))
        except Exception as e:  # never let Kafka trouble break a user's request
            self.dropped.inc()
            log.error("llm message not queued: %s", e)

    async def polls(self, stop: asyncio.Event, client: httpx.AsyncClient) -> None:
        scrapers = [VllmScraper(u) for u in self.cfg.vllm_urls]
        while not stop.is_set():
            self.publish(await poll_ollama(client, self.cfg.ollama_url, self.cfg.monitor_id))
            for scraper in scrapers:
                self.publish(await scraper.poll(client, self.cfg.monitor_id))
            self.producer.poll(0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.poll_interval_s)

    async def probes(self, stop: asyncio.Event, client: httpx.AsyncClient) -> None:
        cfg = self.cfg
        while cfg.probe_model and not stop.is_set():
            self.publish(
                await probe_once(
                    client,
                    url=cfg.ollama_url,
                    model=cfg.probe_model,
                    prompt=cfg.probe_prompt,
                    max_tokens=cfg.probe_max_tokens,
                    monitor_id=cfg.monitor_id,
                    timeout_s=cfg.probe_timeout_s,
                )
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.probe_interval_s)

    def run(self, stop: threading.Event) -> None:
        """Proxy, poll and probe until `stop` is set; the proxy stops accepting however it ends."""
        asyncio.run(self._serve(stop))

    async def _serve(self, stopped: threading.Event) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def bridge() -> None:  # the service's stop (a thread's event) into this event loop
            stopped.wait()
            with contextlib.suppress(RuntimeError):  # the loop already ended on its own (e.g. port taken)
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=bridge, daemon=True).start()
        cfg = self.cfg
        proxy = OllamaProxy(
            upstream=cfg.ollama_url,
            on_session=self.publish,
            monitor_id=cfg.monitor_id,
            allow=cfg.proxy_allow,
            max_body_bytes=cfg.proxy_max_body_bytes,
            head_timeout_s=cfg.proxy_head_timeout_s,
            body_timeout_s=cfg.proxy_body_timeout_s,
            max_connections=cfg.proxy_max_connections,
        )
        port = await proxy.start(self.cfg.listen_host, self.cfg.listen_port)
        log.info(
            "proxying", extra={"listen": f"{self.cfg.listen_host}:{port}", "ollama": self.cfg.ollama_url}
        )
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                await asyncio.gather(self.polls(stop, client), self.probes(stop, client))
        finally:
            await proxy.close()


def main() -> int:
    settings = start_service(LlmSettings, "llm-monitor")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    with ServiceRun("llm-monitor", settings.shutdown) as life:
        try:
            life.serve_metrics(registry, settings.llm.metrics_port, settings.llm.metrics_bind)
            producer = life.enter_context(
                JsonProducer(make_producer(settings.kafka, {"client.id": f"{settings.kafka.client_id}-llm"}))
            )
            Monitor(settings, producer, registry).run(life.stop)
        except OSError as e:  # the proxy's port, or the metrics port
            log.error("llm monitor cannot serve: %s", e)
            return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

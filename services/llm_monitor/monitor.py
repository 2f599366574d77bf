"""The monitor's loop: the Ollama proxy, the server polls and the probe, publishing to llm-sessions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.contract.models_workload import LlmServerStatus, LlmSession
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.kafka import JsonProducer

from .probe import probe_once
from .proxy import OllamaProxy
from .servers import VllmScraper, poll_ollama
from .settings import LlmSettings

log = logging.getLogger("services.llm_monitor")
LLM_SESSIONS = TopicSettings.entry("llm_sessions")  # its messages' key and value


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
            self.producer.produce(self.topic, *LLM_SESSIONS.encode(message))
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

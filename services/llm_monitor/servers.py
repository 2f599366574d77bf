"""What LLM servers report about themselves: Ollama's /api/version and /api/ps, vLLM's Prometheus /metrics.

Each poll becomes one `LlmServerStatus` (kind `server` on llm-sessions). A
server that does not answer is reported `up: false`, not skipped. vLLM's
exposition is parsed with prometheus_client's own parser; its histograms and
counters are cumulative, so TTFT and time per output token are the mean of
the requests that finished between two polls (difference of `_sum` over
difference of `_count`), and token counts are the difference too. Both
the older (`gpu_cache_usage_perc`, `time_per_output_token_seconds`) and the
newer (`kv_cache_usage_perc`, `inter_token_latency_seconds`) names are read.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from shared.contract.models import sane_time
from shared.contract.models_workload import LlmServerStatus, LoadedModel

log = logging.getLogger(__name__)


def _bytes(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53 else None


def _expiry(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return sane_time(parsed)
    except ValueError:
        return None  # Ollama says 0001-01-01, or centuries ahead for "never expires"


def loaded_models(ps: Any) -> list[LoadedModel]:
    """The models in an /api/ps answer; entries that make no sense are left out."""
    out = []
    for entry in (ps.get("models") if isinstance(ps, dict) else None) or []:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name") or entry.get("model")
        if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 253:
            continue
        out.append(
            LoadedModel(
                name=name,
                size_bytes=_bytes(entry.get("size")),
                vram_bytes=_bytes(entry.get("size_vram")),
                expires_at=_expiry(entry.get("expires_at")),
            )
        )
    return out[:256]


async def poll_ollama(client: httpx.AsyncClient, url: str, monitor_id: str) -> LlmServerStatus:
    now = datetime.now(UTC)
    try:
        version = (await client.get(f"{url}/api/version")).raise_for_status().json()
        ps = (await client.get(f"{url}/api/ps")).raise_for_status().json()
    except (httpx.HTTPError, ValueError) as e:
        log.warning("Ollama at %s did not answer: %s", url, e)
        return LlmServerStatus(time=now, monitor_id=monitor_id, server=url, engine="ollama", up=False)
    text = version.get("version") if isinstance(version, dict) else None
    ok_version = text if isinstance(text, str) and text.isprintable() and 0 < len(text) <= 253 else None
    return LlmServerStatus(
        time=now,
        monitor_id=monitor_id,
        server=url,
        engine="ollama",
        up=True,
        version=ok_version,
        models=loaded_models(ps),
    )


_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_TTFT = "vllm:time_to_first_token_seconds"
_TPOT = ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds")
_PROMPT, _GENERATED = "vllm:prompt_tokens_total", "vllm:generation_tokens_total"


def vllm_totals(text: str) -> tuple[set[str], dict[str, float]]:
    """Model names and the sums over models of the samples this monitor reads."""
    models: set[str] = set()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:") or not math.isfinite(sample.value):
                continue
            if (model := sample.labels.get("model_name")) and model.isprintable() and len(model) <= 253:
                models.add(model)
            if sample.name.endswith("_bucket"):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return models, totals


def _mean_ms(now: dict[str, float], before: dict[str, float] | None, names: tuple[str, ...]) -> float | None:
    if before is None:
        return None
    for name in names:
        count = now.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = now.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        if count > 0 and total >= 0:
            return min(total / count * 1000, 86_400_000)
    return None


def _delta(now: dict[str, float], before: dict[str, float] | None, name: str) -> int | None:
    if before is None or name not in now:
        return None
    change = now[name] - before.get(name, 0.0)
    return int(change) if 0 <= change < 1e10 else None  # negative: the server restarted


def _first(totals: dict[str, float], names: tuple[str, ...], high: float) -> float | None:
    for name in names:
        if name in totals and 0 <= totals[name] <= high:
            return totals[name]
    return None


class VllmScraper:
    """Scrapes one vLLM server's /metrics; keeps the previous totals to report per-interval figures."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.metrics_url = self.url if self.url.endswith("/metrics") else f"{self.url}/metrics"
        self._before: dict[str, float] | None = None

    def status(self, text: str, monitor_id: str, now: datetime | None = None) -> LlmServerStatus:
        models, totals = vllm_totals(text)
        before, self._before = self._before, totals
        return LlmServerStatus(
            time=now or datetime.now(UTC),
            monitor_id=monitor_id,
            server=self.url,
            engine="vllm",
            up=True,
            models=[LoadedModel(name=m) for m in sorted(models)][:256],
            requests_running=_first(totals, (_RUNNING,), 1e9),
            requests_waiting=_first(totals, (_WAITING,), 1e9),
            kv_cache_usage_ratio=_first(totals, _CACHE, 1.0),
            ttft_ms=_mean_ms(totals, before, (_TTFT,)),
            tpot_ms=_mean_ms(totals, before, _TPOT),
            prompt_tokens=_delta(totals, before, _PROMPT),
            completion_tokens=_delta(totals, before, _GENERATED),
        )

    async def poll(self, client: httpx.AsyncClient, monitor_id: str) -> LlmServerStatus:
        try:
            response = (await client.get(self.metrics_url)).raise_for_status()
            return self.status(response.text, monitor_id)
        except (httpx.HTTPError, ValueError) as e:
            log.warning("vLLM at %s did not answer: %s", self.url, e)
            return LlmServerStatus(
                time=datetime.now(UTC), monitor_id=monitor_id, server=self.url, engine="vllm", up=False
            )

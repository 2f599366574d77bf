"""A bounded synthetic request to Ollama at an interval: the TTFT and TPS a user would get right now.

Bounded three ways: the answer is capped (`num_predict`), the request has a
timeout, and probes never overlap (one at a time, at most one per interval).
It goes straight to Ollama (not through the proxy) and is recorded with
`source: probe`, so it never mixes with real users' sessions.
"""

from __future__ import annotations

import time

import httpx

from shared.contract.models_workload import LlmSession

from .ollama_metrics import SessionMeter


async def probe_once(
    client: httpx.AsyncClient,
    *,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    monitor_id: str,
    timeout_s: float,
) -> LlmSession:
    meter = SessionMeter(endpoint="/api/generate", model=model, started=time.perf_counter())
    body = {"model": model, "prompt": prompt, "stream": True, "options": {"num_predict": max_tokens}}
    status = 502
    try:
        async with client.stream("POST", f"{url}/api/generate", json=body, timeout=timeout_s) as response:
            status = response.status_code
            async for data in response.aiter_raw():
                meter.feed(data)
    except httpx.HTTPError as e:
        meter.error = f"probe failed: {type(e).__name__} {e}"[:500]
    meter.finish()
    return meter.session(
        status=status,
        streamed=True,
        ended=time.perf_counter(),
        source="probe",
        monitor_id=monitor_id,
        server=url,
    )

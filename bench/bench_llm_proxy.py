"""Ollama proxy: latency it adds per request, next to direct calls to the same mock Ollama in the same run.

Requests alternate direct / proxied on kept-alive connections, so both see the
same machine load; the figure is the difference of the medians. The mock runs
with time_scale=0 (no simulated generation time), which leaves only HTTP and
the proxy's own work in the timings. Shapes: a streamed /api/generate of 16
tokens (17 NDJSON chunks, each relayed and metered) and a GET /api/ps.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from services.llm_monitor.proxy import OllamaProxy
from services.mock_ollama.server import MockOllamaServer

ROUNDS = 600


def start_proxy(upstream: str, sessions: list[object]) -> tuple[str, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def serve() -> None:
        proxy = OllamaProxy(upstream=upstream, on_session=sessions.append, monitor_id="bench")
        port.append(await proxy.start("127.0.0.1", 0))
        ready.set()

    threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True).start()
    ready.wait(10)
    return f"http://127.0.0.1:{port[0]}", loop


def timed(client: httpx.Client, method: str, path: str, body: dict[str, object] | None) -> float:
    start = time.perf_counter()
    if method == "POST":
        with client.stream("POST", path, json=body) as r:
            for _ in r.iter_raw():
                pass
    else:
        client.get(path).read()
    return time.perf_counter() - start


def main() -> int:
    mock = MockOllamaServer("127.0.0.1", 0, time_scale=0).start()
    sessions: list[object] = []
    proxy_url, loop = start_proxy(mock.url, sessions)
    generate = {"model": "qwen2.5:0.5b", "prompt": "bench", "options": {"num_predict": 16}}
    with httpx.Client(base_url=mock.url) as direct, httpx.Client(base_url=proxy_url) as proxied:
        for method, path, body, label in (("POST", "/api/generate", generate, "streamed generate, 16 tokens"),
                                          ("GET", "/api/ps", None, "GET /api/ps")):  # fmt: skip
            for client in (direct, proxied):  # warm: models loaded, connections open
                for _ in range(20):
                    timed(client, method, path, body)
            d, p = [], []
            for _ in range(ROUNDS):
                d.append(timed(direct, method, path, body))
                p.append(timed(proxied, method, path, body))
            med_d, med_p = statistics.median(d) * 1000, statistics.median(p) * 1000
            # (bench._common.report's format; not imported: it pulls in the Kafka client this bench has no use for)
            print(f"proxy, {label}: median latency: {med_p:.3f} ms  |  direct to the mock: {med_d:.3f} ms"
                  f"  |  ratio {med_p / med_d:.3g}")  # fmt: skip
            print(f"proxy, {label}: added median latency {med_p - med_d:.3f} ms"
                  f" (p90 direct {statistics.quantiles(d, n=10)[-1] * 1000:.3f} ms,"
                  f" proxied {statistics.quantiles(p, n=10)[-1] * 1000:.3f} ms; {ROUNDS} each)")  # fmt: skip
    print(f"sessions measured by the proxy: {len(sessions)}")
    loop.call_soon_threadsafe(loop.stop)
    mock.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

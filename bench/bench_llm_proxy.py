"""Ollama proxy: latency it adds per request, next to direct calls to the same mock Ollama in the same run.

Requests alternate direct / proxied on kept-alive connections, so both see the
same machine load; the figure is the difference of the medians. The mock, the
proxy and the client each run in their own process, as deployed. The mock runs
with time_scale=0 (no simulated generation time), which leaves only HTTP and
the proxy's own work in the timings. Shapes: a streamed /api/generate of 16
tokens (17 NDJSON chunks, each relayed and metered) and a GET /api/ps.

`--against DIR` also runs the proxy of another checkout (the previous release,
in a git worktree) in its own process beside this one, on the same mocks, and
takes its requests in the same rounds: the two proxies' figures then differ
only by their code.

Two more figures per proxy and shape, steadier on a busy machine than the
difference of the medians: the median of the per-round differences (each
proxied request against the direct one just before it), and the proxy
process's own CPU time a request (all its threads, from /proc: what the proxy
itself costs, whatever the scheduler adds to the latency).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from services.llm_monitor.proxy import OllamaProxy

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 600


def serve_proxy(upstream: str, port: int) -> None:
    """The proxy alone in this process (the bench runs it so, as a deployment would)."""

    async def serve() -> None:
        proxy = OllamaProxy(upstream=upstream, on_session=lambda s: None, monitor_id="bench")
        await proxy.start("127.0.0.1", port)
        await asyncio.Event().wait()

    asyncio.run(serve())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(args: list[str], url: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, *args], env={**os.environ, **env}, cwd=cwd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{args} did not answer at {url}")


def cpu_s(pid: int) -> float:
    """CPU seconds a process has run so far, all its threads (Linux's schedstat, in ns)."""
    tasks = Path(f"/proc/{pid}/task")
    return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9


def timed(
    client: httpx.Client, method: str, path: str, body: dict[str, object] | None
) -> tuple[float, float]:
    """(whole request, time to the first body bytes) in seconds."""
    start = time.perf_counter()
    first = 0.0
    with client.stream(method, path, json=body) as r:
        for _ in r.iter_raw():
            first = first or time.perf_counter() - start
    return time.perf_counter() - start, first


def measure(
    direct_url: str,
    proxies: dict[str, tuple[str, int]],
    shapes: list[tuple[str, str, dict[str, object] | None, str, int]],
) -> None:
    """Each round asks the mock directly, then through each proxy in turn (by name: its URL and pid)."""
    with contextlib.ExitStack() as stack:
        direct = stack.enter_context(httpx.Client(base_url=direct_url))
        clients = {
            name: stack.enter_context(httpx.Client(base_url=url)) for name, (url, _) in proxies.items()
        }
        for method, path, body, label, rounds in shapes:
            for client in (direct, *clients.values()):  # warm: models loaded, connections open
                for _ in range(10):
                    timed(client, method, path, body)
            d: list[tuple[float, float]] = []
            p: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
            cpu = {name: cpu_s(pid) for name, (_, pid) in proxies.items()}
            for _ in range(rounds):
                d.append(timed(direct, method, path, body))
                for name, client in clients.items():
                    p[name].append(timed(client, method, path, body))
            cpu = {name: cpu_s(pid) - cpu[name] for name, (_, pid) in proxies.items()}
            for name in clients:
                for i, what in ((0, "latency"), (1, "time to first bytes")):
                    med_d = statistics.median(x[i] for x in d) * 1000
                    med_p = statistics.median(x[i] for x in p[name]) * 1000
                    # bench._common.report's format; not imported: it pulls in the Kafka client
                    print(
                        f"{name}, {label}: median {what}: {med_p:.3f} ms"
                        f"  |  direct to the mock: {med_d:.3f} ms"
                        f"  |  ratio {med_p / med_d:.3g}  |  added {med_p - med_d:.3f} ms ({rounds} each)"
                    )
                paired = statistics.median(x[0] - y[0] for x, y in zip(p[name], d, strict=True)) * 1000
                print(
                    f"{name}, {label}: median of the per-round differences: {paired:.3f} ms"
                    f"  |  the proxy's own CPU a request: {cpu[name] / rounds * 1e6:.0f} µs"
                )


def main() -> int:
    if sys.argv[1:2] == ["--serve-proxy"]:  # how this file runs a proxy in a process of its own
        serve_proxy(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against", type=Path, metavar="DIR", help="also run the proxy of this checkout (a previous release)"
    )
    args = parser.parse_args()
    against = args.against.resolve() if args.against is not None else None
    # Mocks, proxies and the client each in their own process: in one, they would share one GIL.
    # A burst mock (no generation time: every chunk at once, the proxy's worst case) and a
    # paced one (real-time token rate: chunks arrive as Ollama would send them).
    processes = []
    urls: dict[str, tuple[str, dict[str, tuple[str, int]]]] = {}
    for name, scale in (("burst", "0"), ("paced", "1")):
        mock_port, proxy_port = free_port(), free_port()
        mock_url, proxy_url = f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{proxy_port}"
        env = {
            "PYTHONPATH": str(ROOT),
            "GPUHEALTH_LOG__JSON": "false",
            "GPUHEALTH_LOG__LEVEL": "WARNING",
            "GPUHEALTH_MOCK_OLLAMA__PORT": str(mock_port),
            "GPUHEALTH_MOCK_OLLAMA__TIME_SCALE": scale,
        }
        processes.append(spawn(["-m", "services.mock_ollama"], mock_url, env))
        processes.append(spawn([__file__, "--serve-proxy", mock_url, str(proxy_port)], proxy_url, env))
        proxies = {"proxy": (proxy_url, processes[-1].pid)}
        if against is not None:  # that checkout's bench serves that checkout's proxy
            old_port = free_port()
            old_url = f"http://127.0.0.1:{old_port}"
            old = [str(against / "bench" / "bench_llm_proxy.py"), "--serve-proxy", mock_url, str(old_port)]
            processes.append(spawn(old, old_url, {**env, "PYTHONPATH": str(against)}, cwd=against))
            proxies[f"proxy of {against.name}"] = (old_url, processes[-1].pid)
        urls[name] = (mock_url, proxies)
    generate: dict[str, object] = {"model": "qwen2.5:0.5b", "prompt": "bench", "options": {"num_predict": 16}}
    try:
        measure(
            *urls["burst"],
            [
                ("POST", "/api/generate", generate, "burst streamed generate, 16 tokens", ROUNDS),
                ("GET", "/api/ps", None, "GET /api/ps", ROUNDS),
            ],
        )
        measure(
            *urls["paced"], [("POST", "/api/generate", generate, "paced streamed generate, 16 tokens", 150)]
        )
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

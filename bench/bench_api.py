"""API latency at 10,000 GPUs: p50/p99 of the fleet summary, the GPU list and a 24-hour series,
next to the same SQL (the endpoint's own statements) run directly through psycopg in the same run,
without the API's cache and with it; and the summary's throughput under `wrk -t2 -c32` next to
/healthz (the framework's own ceiling on this machine).

The three endpoints read gpu_assets, gpu_latest, gpu_status and the 1-minute
rollup; by design none of them reads the raw hypertable (the series serves
buckets of a minute and up from the rollup). The load is therefore what those
queries see with 24 hours of 10-second data: 10,000 GPUs' inventory, latest
sample and status, and 24 h of rollup (14.4 million rows), generated in SQL
into a scratch schema that is dropped afterwards.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import uvicorn

from bench import fleets
from bench._common import callers, report
from services.api.app import create_app, reader_settings
from services.api.deps import state_of
from services.api.settings import ApiSection, missing_after_s
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import Settings
from shared.store import fleet, history

GPUS, HOURS, ROUNDS = 10_000, 24, 150
NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000


def serve(app: Any, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread


def wrk(url: str, script: str, seconds: int = 10) -> tuple[float, float]:
    """Requests/s and p99 (ms) of `wrk -t2 -c32` against url, its requests as `script` makes them."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: scripts/install-tools.sh")
    out = subprocess.run(["wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", script, url],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    p99 = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    return rate, p99


def main() -> int:
    settings = Settings()
    with migrated_schema(settings.db, "bench") as db, callers() as who:
        started = time.perf_counter()
        with connect(db) as conn:
            fleets.fill_api_bench_fleet(conn, as_of=NOW, gpus=GPUS, rollup_minutes=HOURS * 60)
        print(
            f"(loaded {GPUS:,} GPUs and {GPUS * HOURS * 60:,} rollup rows in {time.perf_counter() - started:.0f} s)"
        )
        api = ApiSection()
        # The same app twice: without its cache (every request reads the database), and as
        # deployed (answers kept until the scorer's next cycle; the pipeline is idle here).
        servers = [
            serve(create_app(db, api.model_copy(update={"cache_max_age_s": 0}), auth=who.auth()), 8765)
        ]
        cached_app = create_app(db, api, auth=who.auth())
        servers.append(serve(cached_app, 8766))
        while not state_of(cached_app).cache.listening:
            time.sleep(0.05)
        gpu = "GPU-00004242-0000-4000-8000-000000000000"
        span = {
            "from": (NOW - timedelta(hours=24)).isoformat(),
            "to": (NOW + timedelta(minutes=1)).isoformat(),
        }
        missing_after = missing_after_s(api.rules_file)
        # The endpoint's own statements (shared.store), one after the other on one connection.
        cases: list[tuple[str, str, dict[str, Any], Callable[[Any], object]]] = [
            ("fleet summary", "/api/v1/fleet/summary", {},
             lambda conn: fleet.summary_sync(conn, missing_after_s=missing_after)),
            ("GPU list (100, by score)", "/api/v1/gpus", {"sort": "score", "limit": 100},
             lambda conn: fleet.gpu_page_sync(conn, fleet.GpuFilters(), sort="score", limit=100, offset=0)),
            ("24 h series, 5 min buckets", f"/api/v1/gpus/{gpu}/series", {**span, "bucket": "5m"},
             lambda conn: history.series_sync(conn, gpu, start=NOW - timedelta(hours=24),
                                              end=NOW + timedelta(minutes=1), bucket_s=300)),
        ]  # fmt: skip
        with (
            httpx.Client(base_url="http://127.0.0.1:8765", timeout=60, headers=who.headers()) as http,
            httpx.Client(base_url="http://127.0.0.1:8766", timeout=60, headers=who.headers()) as http_cached,
            connect(reader_settings(db, api)) as conn,
        ):
            for name, path, params, direct_read in cases:
                http.get(path, params=params).raise_for_status()  # warm
                http_cached.get(path, params=params).raise_for_status()
                rest, direct, cached = [], [], []
                for _ in range(ROUNDS):  # interleaved: each meets the same spells of noise
                    t = time.perf_counter()
                    http.get(path, params=params).raise_for_status()
                    rest.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    direct_read(conn)
                    direct.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    http_cached.get(path, params=params).raise_for_status()
                    cached.append(time.perf_counter() - t)
                (p50, p99), (d50, d99), (c50, c99) = (
                    percentiles(rest),
                    percentiles(direct),
                    percentiles(cached),
                )
                report(f"{name}, no cache p50", p50, "ms", "same SQL via psycopg p50", d50)
                report(f"{name}, no cache p99", p99, "ms", "same SQL via psycopg p99", d99)
                if name != cases[-1][0]:  # the series is not cached
                    report(f"{name}, cached p50", c50, "ms", "same SQL via psycopg p50", d50)
                    report(f"{name}, cached p99", c99, "ms", "same SQL via psycopg p99", d99)
        health_rate, health_p99 = wrk("http://127.0.0.1:8766/healthz", who.wrk_script())
        for label, port in (("cached", 8766), ("no cache", 8765)):
            rate, p99 = wrk(f"http://127.0.0.1:{port}/api/v1/fleet/summary", who.wrk_script())
            report(
                f"fleet summary under wrk -t2 -c32 ({label}), req/s", rate, "req/s", "/healthz", health_rate
            )
            report(f"fleet summary under wrk -t2 -c32 ({label}), p99", p99, "ms", "/healthz p99", health_p99)
        for server, thread in servers:
            server.should_exit = True
            thread.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

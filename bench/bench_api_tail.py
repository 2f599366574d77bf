"""The API's tail under 32 concurrent clients: the cached fleet summary's p99 against /healthz's, same run.

The API runs as deployed (`python -m services.api`: one process, the guarded h11
server, its middlewares) over 10,000 GPUs (`--gpus`) in a scratch schema. `wrk -t2 -c32`
asks for /healthz and the cached fleet summary in alternating 10 s rounds, so
both meet the same spells of noise on a shared machine; each round gives
requests/s and p99. Two cases:

- quiet: nothing is scored meanwhile, the cached answer lasts its
  `cache_max_age_s` (30 s);
- cycles: the bench announces a scoring cycle every second (the scorers'
  pg_notify at each commit; three scorers every 30 s announce ten times as
  rarely), so the cache is forgotten and recomputed under load, the moment
  that made the tail.

Target: the summary's p99 within 3x /healthz's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import fleets
from bench._common import Callers, callers, report
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings, Settings
from shared.store.notify import announce_scored

REPO = Path(__file__).resolve().parents[1]
GPUS = 10_000
PORT = 18320
URL = f"http://127.0.0.1:{PORT}"


WHO: Callers | None = None  # the bench's callers (main sets it): wrk's requests carry a viewer's token


def wrk(path: str, seconds: int) -> tuple[float, float, float]:
    """Requests/s, p50 and p99 (ms) of `wrk -t2 -c32` against path."""
    assert WHO is not None
    out = subprocess.run(
        ["wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", WHO.wrk_script(), URL + path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]

    def ms(q: str) -> float:
        value, unit = re.search(rf"{q}%\s+([\d.]+)(us|ms|s)\b", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return rate, ms("50"), ms("99")


def announce_every(db: DatabaseSettings, seconds: float, stop: threading.Event) -> None:
    with connect(db, autocommit=True) as conn:
        while not stop.wait(seconds):
            announce_scored(conn)


def cache_answers() -> str:
    """How the API's cache served its answers so far (its /metrics; an API without them says so)."""
    text = httpx.get(URL + "/metrics", timeout=30).text
    served = {
        sample.labels["served"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "gpuhealth_api_cache_answers"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    return ", ".join(f"{n:,} {how}" for how, n in served.items()) or "not counted by this API"


def rounds(db: DatabaseSettings, case: str, runs: int, seconds: int, cycle_s: float | None) -> None:
    stop = threading.Event()
    announcer = threading.Thread(target=announce_every, args=(db, cycle_s, stop)) if cycle_s else None
    if announcer is not None:
        announcer.start()
    health, summary = [], []
    try:
        for _ in range(runs):
            health.append(wrk("/healthz", seconds))
            summary.append(wrk("/api/v1/fleet/summary", seconds))
            print(f"    ({case}: /healthz {health[-1][0]:,.0f} req/s p99 {health[-1][2]:.1f} ms;"
                  f" summary {summary[-1][0]:,.0f} req/s p99 {summary[-1][2]:.1f} ms;"
                  f" load average {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
    finally:
        stop.set()
        if announcer is not None:
            announcer.join()
    print(f"  {case}: the cache's answers since the API started: {cache_answers()}")
    h99, s99 = statistics.median(h[2] for h in health), statistics.median(s[2] for s in summary)
    report(f"{case}: cached summary p99, median of {runs} rounds", s99, "ms", "/healthz p99", h99)
    ratios = [s[2] / h[2] for s, h in zip(summary, health, strict=True)]
    print(f"  {case}: p99 ratio by round {', '.join(f'{r:.2f}' for r in ratios)}; target <= 3")
    report(f"{case}: cached summary req/s, median", statistics.median(s[0] for s in summary), "req/s",
           "/healthz req/s", statistics.median(h[0] for h in health))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds of each case (default 3)")
    parser.add_argument("--seconds", type=int, default=10, help="each wrk run (default 10)")
    parser.add_argument(
        "--tree", type=Path, default=REPO, help="serve the API of this checkout (default: this one)"
    )
    parser.add_argument("--port", type=int, default=PORT, help=f"the API's port (default {PORT})")
    parser.add_argument("--gpus", type=int, default=GPUS, help=f"the fleet's size (default {GPUS:,})")
    parser.add_argument("--cases", choices=["both", "quiet", "cycles"], default="both", help="which cases")
    args = parser.parse_args()
    global URL
    URL = f"http://127.0.0.1:{args.port}"
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: scripts/install-tools.sh")
    settings = Settings()
    print(f"  the API of {args.tree.resolve()} over {args.gpus:,} GPUs; load average at start"
          f" {os.getloadavg()[0]:.2f}")  # fmt: skip
    global WHO
    with migrated_schema(settings.db, "bench") as db, callers() as WHO:
        with connect(db) as conn:
            # As many rollup rows whatever the size (the summary reads none; they only take time to write).
            minutes = max(1, 60 * GPUS // args.gpus)
            as_of = datetime.now(UTC).replace(second=0, microsecond=0)
            fleets.fill_api_bench_fleet(conn, as_of=as_of, gpus=args.gpus, rollup_minutes=minutes)
        env = {**os.environ, "PYTHONPATH": str(args.tree.resolve()), "GPUHEALTH_DB__HOST": db.host,
               "GPUHEALTH_DB__PORT": str(db.port), "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
               "GPUHEALTH_API__PORT": str(args.port), "GPUHEALTH_LOG__LEVEL": "WARNING",
               **WHO.env}  # fmt: skip
        api = subprocess.Popen([sys.executable, "-m", "services.api"], cwd=args.tree.resolve(), env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (
                        httpx.get(
                            URL + "/api/v1/fleet/summary", headers=WHO.headers(), timeout=30
                        ).status_code
                        == 200
                    ):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or api.poll() is not None:
                    raise RuntimeError("the API did not start")
                time.sleep(0.2)
            if args.cases in ("both", "quiet"):
                rounds(db, "quiet", args.runs, args.seconds, None)
            if args.cases in ("both", "cycles"):
                rounds(db, "a cycle announced every second", args.runs, args.seconds, 1.0)
        finally:
            api.send_signal(signal.SIGTERM)
            api.wait(30)
    print(f"  load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

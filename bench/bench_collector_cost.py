"""The collector's own cost on a node: its CPU share of one core and its RSS over time.

The real collector process (`python -m services.collector`) polls 8 GPUs and publishes
to the real broker (a scratch topic), from one of two sources:

- `mock`: one node of the mock fleet (`python -m services.mock_dcgm`, its own process,
  so its page rendering is not counted), scraped over HTTP;
- `nvml`: the NVML fake the tests use, with 8 GPUs, each call spending what it cost on
  an H100 (bench_nvml's costed fake), put in place of `pynvml` before the collector's
  own `main` runs.

Beside each collector, in the same run and at the same cadence, a bare loop reads the
same source (`source.read()`, what `poll_once` does before enriching and publishing)
and does nothing else: the same-run baseline. Every process is sampled from
/proc/<pid>/stat (utime + stime over wall time, after a warm-up that excludes imports
and connecting) and /proc/<pid>/status (VmRSS). All processes run at the bench's own
nice level.

    python bench/bench_collector_cost.py                     # 10 s poll, 5 minutes (make bench)
    python bench/bench_collector_cost.py --interval 10 --duration 3600 --out cost.json
    python bench/bench_collector_cost.py --interval 2 --duration 600

The targets (issue 36): under 1 % of a core at a 10 s poll, RSS under 100 MB and flat.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import report, scratch_topic, wait_http  # noqa: E402
from bench.cpu import process_cpu, process_rss_mb  # noqa: E402

GPUS = 8
SOURCES = ("mock", "nvml")
TARGET_CPU_PCT, TARGET_RSS_MB = 1.0, 100.0


@dataclass
class Watched:
    """One measured process and what was sampled of it: (seconds since the window opened, CPU s, RSS MB)."""

    name: str
    proc: subprocess.Popen[bytes]
    points: list[tuple[float, float, float]] = field(default_factory=list)

    def sample(self, t: float) -> None:
        cpu, rss = process_cpu(self.proc.pid), process_rss_mb(self.proc.pid)
        if cpu is None or rss is None:
            raise RuntimeError(f"{self.name} (pid {self.proc.pid}) exited: see its log")
        self.points.append((t, cpu, rss))

    def cpu_pct(self) -> float:
        (t0, c0, _), (t1, c1, _) = self.points[0], self.points[-1]
        return 100 * (c1 - c0) / (t1 - t0)

    def rss(self) -> dict[str, float]:
        values = [p[2] for p in self.points]
        return {
            "first": values[0], "last": values[-1], "max": max(values),
            "growth_mb_per_h": slope([p[0] for p in self.points], values) * 3600,
        }  # fmt: skip


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


# --- the processes ---------------------------------------------------------------------------


def install_fake_nvml() -> None:
    """Put bench_nvml's costed 8-GPU fake where `import pynvml` finds it."""
    from bench.bench_nvml import costed_fake

    sys.modules["pynvml"] = costed_fake()  # type: ignore[assignment]


def run_collector_on_fake_nvml() -> int:
    install_fake_nvml()
    from services.collector.__main__ import main as collector_main

    sys.argv[1:] = []  # the collector takes no arguments
    return collector_main()


def run_bare_loop(source: str) -> int:
    """Read the collector's source(s), built from the same settings, at its cadence; nothing else.

    On SIGTERM prints one JSON line: reads done, GPUs in the last read, read errors."""
    if source == "nvml":
        install_fake_nvml()
    from gpuhealth.gpu.readings import SourceError
    from services.collector.build import make_sources
    from services.collector.settings import CollectorSettings

    cfg = CollectorSettings().collector
    sources = make_sources(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    reads = errors = gpus = 0
    next_tick = time.monotonic()
    while not stop.is_set():
        for s in sources:
            try:
                gpus = len(s.read().gpus)
                reads += 1
            except SourceError:
                errors += 1
        next_tick += cfg.interval_s
        stop.wait(max(0.0, next_tick - time.monotonic()))
    for s in sources:
        s.close()
    print(json.dumps({"reads": reads, "gpus": gpus, "errors": errors}), flush=True)
    return 0


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def started(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def collector_counters(port: int) -> dict[str, float]:
    """The collector's own /metrics: what it published and what went wrong."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    wanted = ("samples_published_total", "delivered_total", "poll_overruns_total", "source_errors_total",
              "delivery_failures_total", "dropped_total")  # fmt: skip
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        for w in wanted:
            if base.endswith(w):
                found[w] = found.get(w, 0.0) + float(value)
    return found


# --- the measurement -------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from shared.plumbing.kafka import wait_for_kafka
    from shared.settings.common import Settings

    settings = Settings()
    wait_for_kafka(settings.kafka)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="collector-cost-"))
    logs.mkdir(parents=True, exist_ok=True)
    admin_port, node_port, *metrics_port = args.ports or [free_port() for _ in range(2 + len(args.sources))]
    mock_url = f"http://127.0.0.1:{node_port}/metrics"
    watched: list[Watched] = []
    metrics_ports: dict[str, int] = {}
    with ExitStack() as stack:
        topic = stack.enter_context(scratch_topic(settings.kafka, partitions=1))
        if "mock" in args.sources:
            mock_env = {
                "GPUHEALTH_MOCK__NODES": "1", "GPUHEALTH_MOCK__GPUS_PER_NODE": str(GPUS),
                "GPUHEALTH_MOCK__ADMIN_PORT": str(admin_port), "GPUHEALTH_MOCK__BASE_PORT": str(node_port),
            }  # fmt: skip
            stack.enter_context(started(spawn(["-m", "services.mock_dcgm"], mock_env, logs / "mock.log")))
            wait_http(mock_url)
        for i, source in enumerate(args.sources):
            env = {
                "GPUHEALTH_COLLECTOR__SOURCE": source,
                "GPUHEALTH_COLLECTOR__DCGM_URLS": json.dumps([mock_url]),
                "GPUHEALTH_COLLECTOR__INTERVAL_S": str(args.interval),
                "GPUHEALTH_COLLECTOR__COLLECTOR_ID": f"bench-cost-{source}",
                "GPUHEALTH_COLLECTOR__METRICS_PORT": str(metrics_port[i]),
                "GPUHEALTH_COLLECTOR__SPOOL_PATH": str(logs / f"spool-{source}.jsonl"),
                "GPUHEALTH_TOPICS__METRICS_RAW": topic, "GPUHEALTH_TOPICS__EVENTS": topic,
                "GPUHEALTH_TOPICS__SYSTEMS": topic,
            }  # fmt: skip
            metrics_ports[source] = metrics_port[i]
            here = str(Path(__file__).relative_to(ROOT))
            collector = ["-m", "services.collector"] if source == "mock" else [here, "collector-nvml"]
            pair = {f"collector {source}": collector, f"bare loop {source}": [here, "bare", source]}
            for name, argv in pair.items():
                proc = stack.enter_context(started(spawn(argv, env, logs / f"{name.replace(' ', '-')}.log")))
                watched.append(Watched(name, proc))
        time.sleep(args.warmup_s)  # imports, connections, the first polls: not the steady state
        opened = time.monotonic()
        next_sample = opened
        while True:
            now = time.monotonic() - opened
            for w in watched:
                w.sample(now)
            if now >= args.duration:
                break
            next_sample += min(args.sample_s, args.duration)
            time.sleep(max(0.0, min(next_sample, opened + args.duration) - time.monotonic()))
        counters = {s: collector_counters(p) for s, p in metrics_ports.items()}
        for w in watched:  # bare loops report their reads on SIGTERM
            w.proc.terminate()
            w.proc.wait(30)
    bare = {}
    for w in watched:
        if w.name.startswith("bare"):
            lines = (logs / f"{w.name.replace(' ', '-')}.log").read_text().strip().splitlines()
            bare[w.name] = json.loads(lines[-1]) if lines else {}
    return {
        "interval_s": args.interval, "window_s": args.duration, "warmup_s": args.warmup_s, "gpus": GPUS,
        "nice": os.nice(0), "logs": str(logs),
        "processes": {
            w.name: {"cpu_pct_of_core": w.cpu_pct(), "rss_mb": w.rss(), "points": w.points} for w in watched
        },
        "collector_counters": counters, "bare_loops": bare,
    }  # fmt: skip


def print_figures(result: dict[str, Any]) -> None:
    procs = result["processes"]
    for source in SOURCES:
        col, bare = procs.get(f"collector {source}"), procs.get(f"bare loop {source}")
        if col is None or bare is None:
            continue
        label = f"collector on {source}, {GPUS} GPUs, {result['interval_s']:g} s poll"
        label += f", {result['window_s'] / 60:.0f} min"
        report(f"{label}: CPU share of one core", col["cpu_pct_of_core"], "%",
               "bare read loop", bare["cpu_pct_of_core"])  # fmt: skip
        c, b = col["rss_mb"], bare["rss_mb"]
        report(f"{label}: RSS at end", c["last"], "MB", "bare read loop", b["last"])
        print(
            f"{label}: RSS first {c['first']:.1f} / max {c['max']:.1f} / last {c['last']:.1f} MB, growth "
            f"{c['growth_mb_per_h']:+.2f} MB/h  |  bare: first {b['first']:.1f} / max {b['max']:.1f} / "
            f"last {b['last']:.1f} MB, growth {b['growth_mb_per_h']:+.2f} MB/h"
        )
    print(f"collector counters: {json.dumps(result['collector_counters'])}")
    print(f"bare loops: {json.dumps(result['bare_loops'])}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["collector-nvml"]:
        return run_collector_on_fake_nvml()
    if argv[:1] == ["bare"] and len(argv) == 2 and argv[1] in SOURCES:
        return run_bare_loop(argv[1])
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sources", type=lambda s: s.split(","), default=list(SOURCES))
    parser.add_argument("--interval", type=float, default=10.0, help="poll period, s")
    parser.add_argument("--duration", type=float, default=300.0, help="measured window, s (after warm-up)")
    parser.add_argument("--warmup-s", type=float, default=None, help="default: 3 polls + 10 s")
    parser.add_argument("--sample-s", type=float, default=30.0, help="how often CPU and RSS are sampled")
    ports_help = "mock admin, mock node, each collector's /metrics (default: free ones)"
    parser.add_argument("--ports", type=lambda s: [int(p) for p in s.split(",")], help=ports_help)
    parser.add_argument("--logs", help="where the processes' logs go (default: a new temp dir)")
    parser.add_argument("--out", type=Path, help="write every sampled point as JSON here")
    args = parser.parse_args(argv)
    if unknown := [s for s in args.sources if s not in SOURCES]:
        parser.error(f"unknown sources {unknown}; known: {', '.join(SOURCES)}")
    if args.ports is not None and len(args.ports) != 2 + len(args.sources):
        parser.error(f"--ports takes {2 + len(args.sources)} ports: mock admin, mock node, one per source")
    if args.warmup_s is None:
        args.warmup_s = 3 * args.interval + 10
    result = measure(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print_figures(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

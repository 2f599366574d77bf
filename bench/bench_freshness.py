"""Freshness: from a GPU's poll to its row visible in the API, p50/p99, next to the poll interval.

A fleet of GPUS GPUs is polled every POLL_S seconds: each poll publishes one
sample per GPU, stamped with the poll's time, through the project's producer
(as the collector publishes: idempotent, linger 20 ms, compressed). The real
sink (`python -m services.sink`, its defaults) stores them; the real API
(uvicorn, its defaults) serves them. A watcher asks the API for one GPU's
detail as fast as it answers and notes when each poll's sample first shows as
its latest. Freshness = that moment less the poll's time. Target: p99 <= 2 s
plus one poll interval.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import uvicorn

from bench._common import callers, report, scratch_topic
from gpuhealth.contract.wire_time import wire_time
from services.api.app import create_app
from services.api.settings import ApiSection
from shared.fakes.samples import gpu_uuid, sample
from shared.plumbing.kafka import JsonProducer, make_producer, wait_for_kafka
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import Settings

REPO = Path(__file__).resolve().parents[1]
GPUS, POLL_S, POLLS = 1000, 1.0, 30
WATCHED = gpu_uuid(7)


def watch(
    url: str,
    headers: dict[str, str],
    polls: list[datetime],
    seen: dict[datetime, float],
    stop: threading.Event,
) -> None:
    """Note when each poll's sample is first the watched GPU's latest in the API."""
    with httpx.Client(timeout=10, headers=headers) as http:
        while not stop.is_set():
            latest = (http.get(url).json().get("latest") or {}).get("time")
            now = time.time()
            if latest is not None:
                shown = datetime.fromisoformat(latest)
                for t in polls:
                    if t <= shown and t not in seen:
                        seen[t] = now
            time.sleep(0.005)


def main() -> int:
    settings = Settings()
    wait_for_kafka(settings.kafka)
    with (
        migrated_schema(settings.db, "bench") as db,
        scratch_topic(settings.kafka) as topic,
        callers() as who,
    ):
        env = {
            **os.environ, "PYTHONPATH": str(REPO),
            "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "GPUHEALTH_DB__HOST": db.host, "GPUHEALTH_DB__PORT": str(db.port),
            "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "",
            "GPUHEALTH_TOPICS__METRICS_RAW": topic, "GPUHEALTH_TOPICS__EVENTS": f"{topic}-events",
            "GPUHEALTH_TOPICS__DEAD_LETTERS": f"{topic}-dlq",
            "GPUHEALTH_SINK__GROUP_ID": f"fresh-{uuid.uuid4().hex[:8]}",
            "GPUHEALTH_SINK__METRICS_PORT": "0",
        }  # fmt: skip
        sink = subprocess.Popen(
            [sys.executable, "-m", "services.sink"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(db, ApiSection(), auth=who.auth()),
                host="127.0.0.1",
                port=8767,
                log_config=None,
                access_log=False,
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        kafka = make_producer(settings.kafka)
        producer = JsonProducer(kafka)
        polls: list[datetime] = []
        seen: dict[datetime, float] = {}
        stop = threading.Event()
        try:
            while not server.started:
                time.sleep(0.05)
            watcher = threading.Thread(
                target=watch,
                args=(f"http://127.0.0.1:8767/api/v1/gpus/{WATCHED}", who.headers(), polls, seen, stop),
            )
            # one warm-up poll: the sink joins its group and the API its pool
            publish(producer, topic, datetime.now(UTC))
            kafka.flush(30)
            next_poll = time.monotonic() + 5
            watcher.start()
            for _ in range(POLLS):
                time.sleep(max(0.0, next_poll - time.monotonic()))
                next_poll += POLL_S
                t = datetime.now(UTC)
                t = t.replace(microsecond=t.microsecond // 1000 * 1000)  # the contract keeps milliseconds
                polls.append(t)
                publish(producer, topic, t)
                kafka.poll(0)
            deadline = time.monotonic() + 30
            while len(seen) < len(polls) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            kafka.flush(30)
            sink.send_signal(signal.SIGTERM)
            sink.wait(60)
            server.should_exit = True
            thread.join(10)
    missing = [t for t in polls if t not in seen]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(polls)} polls never showed in the API")
    lags = sorted(seen[t] - t.timestamp() for t in polls)
    p99 = lags[max(0, int(len(lags) * 0.99) - 1)]
    print(f"  freshness over {len(lags)} polls of {GPUS:,} GPUs: min {lags[0]:.3f} s, max {lags[-1]:.3f} s")
    report("poll -> row -> visible in the API, p50", median(lags), "s", "poll interval", POLL_S)
    report("poll -> row -> visible in the API, p99", p99, "s", "poll interval", POLL_S)
    verdict = "met" if p99 <= 2 + POLL_S else "NOT met"
    print(f"  target p99 <= 2 s + one poll interval = {2 + POLL_S:.1f} s: {verdict}")
    return 0


def publish(producer: JsonProducer, topic: str, t: datetime) -> None:
    """One poll of the fleet: a sample per GPU, stamped with the poll's time."""
    for g in range(GPUS):
        message: dict[str, Any] = {**sample(g, GPUS), "time": wire_time(t)}
        producer.produce(topic, message["gpu_uuid"], message)


if __name__ == "__main__":
    sys.exit(main())

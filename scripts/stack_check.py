"""Check the pipeline `make up` runs, from outside, as a user would: `python scripts/stack_check.py`.

Every GPU of the mock fleet is listed by the API, seen within the last minute and judged (a GPU the
mock's ground truth says was broken must not be judged healthy), and the scorer has finished a cycle
since it started. The API lists no other GPU (a test that wrote into the stack's own tables or topics
would show up here). `--timeout` waits that long
for it; CI runs it after `make up` and again after `make test`, which must leave the stack as it found it.
It reads the API as `make up`'s viewer (`$GPUHEALTH_RUN/auth/viewer.token`, or `--token-file`).

Then Kafka's identities: the broker refuses a write to the verdicts' topic by any principal but the
scorer's (the collector's and the remediator's are tried, with their certificates of the local stack),
and any client without a certificate (#41).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import confluent_kafka
from prometheus_client.parser import text_string_to_metric_families

HEADERS: dict[str, str] = {}  # the viewer's Authorization, for the API (main sets it)


def get(url: str) -> object:
    request = urllib.request.Request(url, headers=HEADERS)  # noqa: S310 (loopback, from our own settings)
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (loopback, from our own settings)
        return json.load(answer)


def _age_s(seen: object, now: datetime) -> float:
    if not isinstance(seen, str):
        return float("inf")
    return (now - datetime.fromisoformat(seen.replace("Z", "+00:00"))).total_seconds()


def problems(api: str, mock_admin: str) -> list[str]:
    fleet, truth = get(f"{mock_admin}/fleet"), get(f"{mock_admin}/ground-truth")
    assert isinstance(fleet, dict)
    assert isinstance(truth, dict)
    simulated = {g["uuid"] for node in fleet["nodes"] for g in node["gpus"]}
    failed = set(truth["failures"])  # GPUs the mock gave a hard failure
    listed: dict[str, dict[str, object]] = {}
    offset = 0
    while True:
        page = get(f"{api}/api/v1/gpus?limit=1000&offset={offset}")
        assert isinstance(page, dict)
        listed |= {g["gpu_uuid"]: g for g in page["gpus"]}
        offset += len(page["gpus"])
        if not page["gpus"] or offset >= page["total"]:
            break
    found = []
    if missing := simulated - set(listed):
        found.append(f"{len(missing)} of {len(simulated)} simulated GPUs not listed by the API")
    if foreign := set(listed) - simulated:
        found.append(
            f"{len(foreign)} GPUs listed that the mock fleet does not have, e.g. {sorted(foreign)[0]}"
        )
    now = datetime.now(UTC)
    stale = sorted(u for u in simulated & set(listed) if _age_s(listed[u]["last_seen"], now) > 60)
    if stale:
        found.append(f"{len(stale)} GPUs not seen in the last minute, e.g. {stale[0]}")
    judged = {u: listed[u]["state"] for u in simulated & set(listed)}
    if unjudged := sorted(u for u, state in judged.items() if state is None):
        found.append(f"{len(unjudged)} GPUs without a verdict, e.g. {unjudged[0]}")
    # A GPU the mock broke must not look healthy (one without a fault may carry an earlier run's history).
    if missed := sorted(u for u, state in judged.items() if u in failed and state == "healthy"):
        found.append(f"{len(missed)} GPUs with an injected hard fault judged healthy, e.g. {missed[0]}")
    cycles = _scorer_cycles()
    if not cycles:
        found.append(f"the scorer has finished no cycle ({cycles})")
    return found


def _scorer_cycles() -> float:
    port = os.environ.get("GPUHEALTH_SCORER_METRICS_PORT", "9502")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpuhealth_scorer_cycles_total"
    )


def _tls_dir() -> Path:
    if os.environ.get("GPUHEALTH_TLS"):
        return Path(os.environ["GPUHEALTH_TLS"])
    cache = Path(os.environ.get("GPUHEALTH_CACHE") or Path.home() / ".cache" / "gpu-health")
    return Path(os.environ.get("GPUHEALTH_RUN") or cache / "run") / "tls"


def write_outcome(principal: str | None, topic: str) -> str:
    """One record to `topic` as `principal` (None: no certificate): "written", or the error's name."""
    tls = _tls_dir()
    bootstrap = f"127.0.0.1:{os.environ.get('GPUHEALTH_KAFKA_PORT', '9092')}"
    config = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls / "ca.pem"),
        "message.timeout.ms": 10_000,
        "error_cb": lambda _: None,  # an anonymous client's refused handshakes: its outcome says so
        "log_level": 0,
    }
    if principal:
        config |= {"ssl.certificate.location": str(tls / f"{principal}.pem"),
                   "ssl.key.location": str(tls / f"{principal}.key")}  # fmt: skip
    outcome: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer(config)
    producer.produce(topic, b'{"probe": "stack_check"}', key=b"GPU-stack-check",
                     on_delivery=lambda err, _: outcome.append(err))  # fmt: skip
    producer.flush(20)
    if not outcome:
        return "no delivery report"
    return "written" if outcome[0] is None else outcome[0].name()


def kafka_problems() -> list[str]:
    """What Kafka let through that it must refuse: verdicts written by another principal, or anonymously."""
    if not (_tls_dir() / "ca.pem").is_file():
        return [f"no {_tls_dir()}/ca.pem: the local broker runs without identities (make services)"]
    verdicts = os.environ.get("GPUHEALTH_TOPICS__HEALTH", "gpu-health")
    found = []
    for who in ("collector", "remediator", None):
        outcome = write_outcome(who, verdicts)
        if outcome == "written":
            found.append(f"{who or 'a client without a certificate'} wrote to {verdicts}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for a good answer")
    run = Path(os.environ.get("GPUHEALTH_RUN") or Path.home() / ".cache" / "gpu-health" / "run")
    parser.add_argument("--token-file", type=Path, default=run / "auth" / "viewer.token",
                        help="a viewer's token (default: %(default)s, which `make up` writes)")  # fmt: skip
    args = parser.parse_args()
    HEADERS["Authorization"] = f"Bearer {args.token_file.read_text().strip()}"
    api = f"http://127.0.0.1:{os.environ.get('GPUHEALTH_API_PORT', '8000')}"
    mock_admin = f"http://127.0.0.1:{os.environ.get('GPUHEALTH_MOCK_ADMIN_PORT', '9399')}"
    start = time.monotonic()
    found = ["not asked yet"]
    while time.monotonic() - start < args.timeout:
        try:
            found = problems(api, mock_admin)
        except OSError as e:
            found = [f"not answering: {e}"]
        if not found:
            took = time.monotonic() - start
            print(f"stack_check: every simulated GPU seen and judged, no other listed ({took:.0f} s)")
            if refused := kafka_problems():
                print(f"stack_check: Kafka: {'; '.join(refused)}", file=sys.stderr)
                return 1
            print(
                "stack_check: Kafka refused the collector's and the remediator's verdicts, and anonymous ones"
            )
            return 0
        time.sleep(2)
    print(f"stack_check: after {args.timeout:.0f} s: {'; '.join(found)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

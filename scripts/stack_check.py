"""Check the pipeline `make up` runs, from outside, as a user would: `python scripts/stack_check.py`.

Every GPU of the mock fleet is listed by the API, seen within the last minute, and judged as the mock's
ground truth says it is: healthy unless a fault was injected into it. The API lists no other GPU (a
test that wrote into the stack's own tables or topics would show up here). `--timeout` waits that long
for it; CI runs it after `make up` and again after `make test`, which must leave the stack as it found it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from datetime import UTC, datetime


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 (loopback, from our own settings)
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
    faulty = {f["gpu_uuid"] for f in truth["faults"]} | set(truth["failures"])
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
    if wrong := sorted(u for u, state in judged.items() if u not in faulty and state != "healthy"):
        found.append(
            f"{len(wrong)} GPUs without a fault not judged healthy, e.g. {wrong[0]}: {judged[wrong[0]]}"
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for a good answer")
    args = parser.parse_args()
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
            print(
                f"stack_check: every simulated GPU seen and judged as the mock says, no other ({took:.0f} s)"
            )
            return 0
        time.sleep(2)
    print(f"stack_check: after {args.timeout:.0f} s: {'; '.join(found)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

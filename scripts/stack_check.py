"""Check the pipeline `make up` runs, from outside, as a user would: `python scripts/stack_check.py`.

Every GPU of the mock fleet is listed by the API with a verdict, and the API lists no other GPU (a test
that wrote into the stack's own tables or topics would show up here). `--timeout` waits that long for
it; CI runs it after `make up` and again after `make test`, which must leave the stack as it found it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 (loopback, from our own settings)
        return json.load(answer)


def problems(api: str, mock_admin: str) -> list[str]:
    fleet = get(f"{mock_admin}/fleet")
    assert isinstance(fleet, dict)
    simulated = {g["uuid"] for node in fleet["nodes"] for g in node["gpus"]}
    listed: dict[str, str] = {}
    offset = 0
    while True:
        page = get(f"{api}/api/v1/gpus?limit=1000&offset={offset}")
        assert isinstance(page, dict)
        listed |= {g["gpu_uuid"]: g["state"] for g in page["gpus"]}
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
    if unscored := sorted(u for u in simulated & set(listed) if listed[u] is None):
        found.append(f"{len(unscored)} GPUs without a verdict, e.g. {unscored[0]}")
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
            print(f"stack_check: every simulated GPU scored, no other listed ({took:.0f} s)")
            return 0
        time.sleep(2)
    print(f"stack_check: after {args.timeout:.0f} s: {'; '.join(found)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
